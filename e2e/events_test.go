package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// hookReceiver is a webhook receiver on loopback: it refuses the first
// refuse requests with 503, then keeps what it receives.
type hookReceiver struct {
	mu     sync.Mutex
	refuse int
	calls  int
	got    []receivedHook
	srv    *httptest.Server
}

type receivedHook struct {
	header http.Header
	body   []byte
}

func newHookReceiver(t *testing.T, refuse int) *hookReceiver {
	h := &hookReceiver{refuse: refuse}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		h.mu.Lock()
		defer h.mu.Unlock()
		h.calls++
		if h.refuse > 0 {
			h.refuse--
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		h.got = append(h.got, receivedHook{header: r.Header.Clone(), body: b})
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// types are the event types received, in order of arrival.
func (h *hookReceiver) types(field string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, g := range h.got {
		var v map[string]any
		_ = json.Unmarshal(g.body, &v)
		out = append(out, v[field].(string))
	}
	return out
}

func (h *hookReceiver) received() []receivedHook {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.got)
}

// TestEvents: a sandbox's life (created, running, a new timeout, pause,
// resume, a named snapshot, a run's end, stop) is listed by GET
// /api/events and delivered to a webhook on loopback, signed; a receiver
// that refuses twice gets the event at the third attempt, each attempt
// shown in the deliveries; an E2B webhook gets E2B's payload and
// signature; E2B's events API lists the same; the CLI lists and follows
// them; another account sees none of it.
func TestEvents(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "events.db"), "--webhooks-allow-private", "--webhook-retry-base", "200ms")
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)
	var ek key // alice's, in E2B's form
	s.admin(&ek, "admin", "key", "create", "--account", alice.ID, "--format", "e2b", "--json")
	e2b := func(method, path string, body any) response {
		t.Helper()
		return s.call(method, path, map[string]string{"X-API-Key": ek.Key}, body)
	}
	all := newHookReceiver(t, 0)
	flaky := newHookReceiver(t, 2)
	e2bHook := newHookReceiver(t, 0)
	bobs := newHookReceiver(t, 0)

	r := s.as(ak, "POST", "/api/webhooks", map[string]any{"url": all.srv.URL + "/in", "name": "all"})
	if r.Status != 200 || r.Body["secret"] == nil {
		t.Fatalf("register: %d %s", r.Status, r.Raw)
	}
	secret := r.Body["secret"].(string)
	allID := r.Body["webhook"].(map[string]any)["id"].(string)
	r = s.as(ak, "POST", "/api/webhooks", map[string]any{"url": flaky.srv.URL, "events": []string{"sandbox.stopped"}, "secret": "flaky-secret-0123456789"})
	if r.Status != 200 {
		t.Fatalf("register flaky: %d %s", r.Status, r.Raw)
	}
	flakyID := r.Body["webhook"].(map[string]any)["id"].(string)
	if r := s.as(bk, "POST", "/api/webhooks", map[string]any{"url": bobs.srv.URL}); r.Status != 200 {
		t.Fatalf("register bob's: %d %s", r.Status, r.Raw)
	}
	e2bSecret := "e2b-secret-for-signatures"
	if r := e2b("POST", "/events/webhooks", map[string]any{"name": "e2b", "url": e2bHook.srv.URL, "enabled": true,
		"events": []string{"sandbox.lifecycle.created", "sandbox.lifecycle.paused", "sandbox.lifecycle.killed"}, "signatureSecret": e2bSecret}); r.Status != 201 {
		t.Fatalf("register an E2B webhook: %d %s", r.Status, r.Raw)
	}

	// A sandbox's life.
	sb := s.createSandbox(ak, map[string]any{"command": "true"})
	id := sb["sandboxId"].(string)
	if run := s.waitRun(ak, sb["runId"].(string), 2*time.Minute); run.Status != "COMPLETED" {
		t.Fatalf("run %+v", run)
	}
	for _, step := range []struct{ path string }{{"/timeout"}, {"/pause"}, {"/resume"}, {"/snapshots"}, {"/stop"}} {
		body := map[string]any{}
		if step.path == "/timeout" {
			body["timeout"] = 300000
		}
		if r := s.as(ak, "POST", "/api/sandboxes/"+id+step.path, body); r.Status != 200 {
			t.Fatalf("%s: %d %s", step.path, r.Status, r.Raw)
		}
	}
	want := []string{"sandbox.created", "sandbox.running", "run.finished", "sandbox.updated", "sandbox.paused", "sandbox.resumed", "sandbox.snapshot", "sandbox.stopped"}
	r = s.as(ak, "GET", "/api/events?sandbox_id="+id+"&order=asc", nil)
	var got []string
	for _, e := range r.Body["events"].([]any) {
		got = append(got, e.(map[string]any)["type"].(string))
	}
	if r.Status != 200 || !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v (%d %s)", got, want, r.Status, r.Raw)
	}
	if r := s.as(bk, "GET", "/api/events?sandbox_id="+id, nil); r.Status != 200 || len(r.Body["events"].([]any)) != 0 {
		t.Fatalf("bob lists alice's events: %d %s", r.Status, r.Raw)
	}

	// Delivered, each once, signed.
	deadline := time.Now().Add(time.Minute)
	for len(all.received()) < len(want) || len(flaky.received()) < 1 || len(e2bHook.received()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("deliveries: all %v, flaky %d, e2b %v", all.types("type"), len(flaky.received()), e2bHook.types("type"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // none more arrive
	gotAll := all.types("type")
	slices.Sort(gotAll)
	sortedWant := slices.Clone(want)
	slices.Sort(sortedWant)
	if !slices.Equal(gotAll, sortedWant) {
		t.Fatalf("the webhook got %v, want each of %v once", gotAll, want)
	}
	for _, h := range all.received() {
		ts, err := strconv.ParseInt(h.header.Get(webhooks.HeaderTimestamp), 10, 64)
		if err != nil || h.header.Get(webhooks.HeaderSignature) != webhooks.Sign([]byte(secret), ts, h.body) || h.header.Get(webhooks.HeaderWebhookID) != allID {
			t.Fatalf("a delivery's signature: %v", h.header)
		}
	}
	if got := e2bHook.types("type"); len(got) != 3 {
		t.Fatalf("the E2B webhook got %v", got)
	}
	for _, h := range e2bHook.received() {
		if h.header.Get("e2b-signature") != webhooks.SignE2B([]byte(e2bSecret), h.body) || !strings.Contains(string(h.body), `"sandboxId":"sbx-`) {
			t.Fatalf("an E2B delivery: %v %s", h.header, h.body)
		}
	}
	if len(bobs.received()) != 0 {
		t.Fatalf("bob's webhook got alice's events: %v", bobs.types("type"))
	}
	r = s.as(ak, "GET", "/api/webhooks/"+flakyID+"/deliveries", nil)
	ds, _ := r.Body["deliveries"].([]any)
	if r.Status != 200 || len(ds) != 1 {
		t.Fatalf("flaky's deliveries: %d %s", r.Status, r.Raw)
	}
	if d := ds[0].(map[string]any); d["status"] != "delivered" || d["attempts"] != 3.0 || d["response_status"] != 204.0 {
		t.Fatalf("flaky's delivery %v", d)
	}
	if r := s.as(bk, "GET", "/api/webhooks/"+flakyID+"/deliveries", nil); r.Status != 404 {
		t.Fatalf("bob reads alice's deliveries: %d", r.Status)
	}

	// E2B's events API: the same, in E2B's shape.
	req, _ := http.NewRequest("GET", s.base+"/events/sandboxes/"+strings.Replace(id, "sbx_", "sbx-", 1)+"?orderAsc=true&limit=100", nil)
	req.Header.Set("X-API-Key", ek.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e2bEvents []map[string]any
	if err := json.Unmarshal(raw, &e2bEvents); err != nil || resp.StatusCode != 200 {
		t.Fatalf("E2B's events: %d %s", resp.StatusCode, raw)
	}
	var e2bTypes []string
	for _, e := range e2bEvents {
		e2bTypes = append(e2bTypes, e["type"].(string))
	}
	if !slices.Equal(e2bTypes, []string{"sandbox.lifecycle.created", "sandbox.lifecycle.updated", "sandbox.lifecycle.paused", "sandbox.lifecycle.resumed",
		"sandbox.lifecycle.checkpointed", "sandbox.lifecycle.killed"}) {
		t.Fatalf("E2B's events %v", e2bTypes)
	}

	// The CLI: listed, as JSON.
	cr := runCLI(t, nil, nil, "events", "--url", s.base, "--key", ak.Key, "--json", "--sandbox", id)
	var listed []map[string]any
	if cr.code != 0 || json.Unmarshal([]byte(cr.stdout), &listed) != nil || len(listed) != len(want) || listed[0]["type"] != "sandbox.stopped" {
		t.Fatalf("sandboxd events: %d %s %s", cr.code, cr.stdout, cr.stderr)
	}
	// MCP: the same list.
	if a := s.mcpConnect(ak).call(t, "list_events", map[string]any{"sandbox_id": id, "limit": 100}, ""); a.IsError || len(a.Data["events"].([]any)) != len(want) {
		t.Fatalf("list_events: %+v", a)
	}
	if a := s.mcpConnect(bk).call(t, "list_events", map[string]any{"sandbox_id": id}, ""); a.IsError || len(a.Data["events"].([]any)) != 0 {
		t.Fatalf("bob's list_events: %+v", a)
	}
	// --follow: the events of a sandbox created after it started, as they
	// come.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	follow := osexec.CommandContext(ctx, binary, "events", "--url", s.base, "--key", ak.Key, "--json", "--follow", "--type", "sandbox.created,sandbox.stopped")
	stdout, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = follow.Wait() }()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	time.Sleep(1500 * time.Millisecond) // its first look
	later := s.createSandbox(ak, map[string]any{})["sandboxId"].(string)
	s.as(ak, "POST", "/api/sandboxes/"+later+"/stop", map[string]any{})
	var followed []string
	for len(followed) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("events --follow ended; it printed %v", followed)
			}
			var e map[string]any
			if json.Unmarshal([]byte(l), &e) == nil && e["sandbox_id"] == later {
				followed = append(followed, e["type"].(string))
			}
		case <-ctx.Done():
			t.Fatalf("events --follow printed %v of the new sandbox", followed)
		}
	}
	if !slices.Equal(followed, []string{"sandbox.created", "sandbox.stopped"}) {
		t.Fatalf("events --follow: %v", followed)
	}
	cr = runCLI(t, nil, nil, "webhook", "--url", s.base, "--key", ak.Key, "deliveries", allID)
	if cr.code != 0 || strings.Count(cr.stdout, "delivered") < len(want) {
		t.Fatalf("sandboxd webhook deliveries: %d %s %s", cr.code, cr.stdout, cr.stderr)
	}
}
