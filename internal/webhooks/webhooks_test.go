package webhooks_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// receiver is a webhook receiver on loopback that answers fail's statuses
// first, then 204, and keeps what it received.
type receiver struct {
	mu    sync.Mutex
	fail  []int
	got   []*http.Request
	body  [][]byte
	srv   *httptest.Server
	calls int
}

func newReceiver(t *testing.T, fail ...int) *receiver {
	r := &receiver{fail: fail}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.calls++
		if len(r.fail) > 0 {
			code := r.fail[0]
			r.fail = r.fail[1:]
			http.Error(w, "not now", code)
			return
		}
		r.got = append(r.got, req)
		r.body = append(r.body, b)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) received() ([]*http.Request, [][]byte, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*http.Request(nil), r.got...), append([][]byte(nil), r.body...), r.calls
}

// fixture is the service over a SQLite store, with River working its
// deliveries and its dispatcher running; alice and bob are accounts.
type fixture struct {
	st         *store.Store
	svc        *webhooks.Service
	alice, bob string
}

func newFixture(t *testing.T, allowPrivate bool) *fixture {
	t.Helper()
	return newFixtureWith(t, allowPrivate, nil)
}

// resolver answers names from a map the test changes (DNS that rebinds).
type resolver struct {
	mu    sync.Mutex
	addrs map[string]string
}

func (r *resolver) set(host, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs[host] = addr
}

func (r *resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.addrs[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return []netip.Addr{netip.MustParseAddr(a)}, nil
}

func newFixtureWith(t *testing.T, allowPrivate bool, res *resolver) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	f := &fixture{st: st}
	for _, name := range []string{"alice", "bob"} {
		a := store.Account{Name: name, Kind: store.AccountPersonal}
		if err := st.CreateAccount(ctx, &a); err != nil {
			t.Fatal(err)
		}
		if name == "alice" {
			f.alice = a.ID
		} else {
			f.bob = a.ID
		}
	}
	workers := river.NewWorkers()
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here", Workers: workers, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	cfg := webhooks.Config{Store: st, Jobs: jc, Key: bytes.Repeat([]byte{7}, 32), AllowPrivate: allowPrivate,
		RetryBase: 20 * time.Millisecond, Timeout: 5 * time.Second}
	if res != nil {
		cfg.Resolver = res
	}
	svc, err := webhooks.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svc.RegisterWorkers(workers)
	if err := jc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = jc.Stop(context.Background())
		jc.Close()
	})
	f.svc = svc
	return f
}

// sandbox records a running sandbox of account: two events.
func (f *fixture) sandbox(t *testing.T, account string) store.Sandbox {
	t.Helper()
	sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: account, NodeID: "here", Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
	if err := f.st.CreateSandbox(t.Context(), &sb); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.TransitionSandbox(t.Context(), sb.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	return sb
}

func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDelivery: a webhook gets its account's events, each once, signed
// with its secret (a receiver's check of the signature passes, and fails
// with another secret); a receiver that refuses twice gets the event at
// the third attempt, every attempt recorded; one that always refuses ends
// failed after jobs.DeliveryAttempts; a webhook's filter holds; bob's
// webhook gets none of alice's events.
func TestDelivery(t *testing.T) {
	f := newFixture(t, true)
	ctx := t.Context()
	ok := newReceiver(t)
	flaky := newReceiver(t, 500, 503)
	down := newReceiver(t, 500, 500, 500, 500, 500, 500, 500, 500, 500)
	bobs := newReceiver(t)
	secret := "a-secret-of-sixteen-bytes-or-more"
	reg := func(account, url string, events ...string) store.Webhook {
		t.Helper()
		spec := webhooks.Spec{URL: &url, Secret: &secret}
		if events != nil {
			spec.Events = &events
		}
		w, got, err := f.svc.Create(ctx, account, spec)
		if err != nil || got != secret {
			t.Fatalf("create %s: %v", url, err)
		}
		return w
	}
	whOK := reg(f.alice, ok.srv.URL)
	whFlaky := reg(f.alice, flaky.srv.URL, store.EventRunning)
	whDown := reg(f.alice, down.srv.URL, store.EventCreated)
	reg(f.bob, bobs.srv.URL)

	sb := f.sandbox(t, f.alice)
	until(t, "the two events at ok", func() bool { got, _, _ := ok.received(); return len(got) == 2 })
	got, bodies, _ := ok.received()
	seen := map[string]bool{}
	for i, req := range got {
		// Deliveries are not ordered: each says its event's type and time.
		body := bodies[i]
		var ev store.Event
		if err := json.Unmarshal(body, &ev); err != nil || ev.SandboxID != sb.ID || ev.AccountID != f.alice {
			t.Fatalf("delivery %d: %s %v", i, body, err)
		}
		seen[ev.Type] = true
		if req.Header.Get(webhooks.HeaderEvent) != ev.Type || req.Header.Get(webhooks.HeaderWebhookID) != whOK.ID || req.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("delivery %d's headers %v", i, req.Header)
		}
		ts, err := strconv.ParseInt(req.Header.Get(webhooks.HeaderTimestamp), 10, 64)
		if err != nil || time.Since(time.Unix(ts, 0)) > time.Minute {
			t.Fatalf("timestamp %q", req.Header.Get(webhooks.HeaderTimestamp))
		}
		if sig := req.Header.Get(webhooks.HeaderSignature); sig != webhooks.Sign([]byte(secret), ts, body) || sig == webhooks.Sign([]byte("another secret here"), ts, body) {
			t.Fatalf("signature %q", sig)
		}
	}
	if !seen[store.EventCreated] || !seen[store.EventRunning] {
		t.Fatalf("ok got %v", seen)
	}
	until(t, "flaky's third attempt", func() bool { got, _, _ := flaky.received(); return len(got) == 1 })
	ds, err := f.svc.Deliveries(ctx, f.alice, whFlaky.ID, 10)
	if err != nil || len(ds) != 1 || ds[0].Attempts != 3 || ds[0].Status != store.DeliveryDelivered || ds[0].ResponseStatus != 204 {
		t.Fatalf("flaky's deliveries %+v %v", ds, err)
	}
	until(t, "down's delivery failed", func() bool {
		ds, _ := f.svc.Deliveries(ctx, f.alice, whDown.ID, 10)
		return len(ds) == 1 && ds[0].Status == store.DeliveryFailed
	})
	ds, _ = f.svc.Deliveries(ctx, f.alice, whDown.ID, 10)
	if ds[0].Attempts != jobs.DeliveryAttempts || ds[0].ResponseStatus != 500 || !strings.Contains(ds[0].LastError, "answered 500") {
		t.Fatalf("down's delivery %+v", ds[0])
	}
	if _, _, calls := bobs.received(); calls != 0 {
		t.Fatalf("bob's webhook got %d of alice's events", calls)
	}
	if _, err := f.svc.Deliveries(ctx, f.bob, whOK.ID, 10); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob reads alice's deliveries: %v", err)
	}
}

// TestE2BFormat: an E2B webhook takes E2B's type names, gets E2B's payload
// (the sandbox id in E2B's form) and its e2b-signature, and no event E2B
// has no name for.
func TestE2BFormat(t *testing.T) {
	f := newFixture(t, true)
	ctx := t.Context()
	r := newReceiver(t)
	secret := "e2b-secret-for-signing"
	url := r.srv.URL
	if _, _, err := f.svc.Create(ctx, f.alice, webhooks.Spec{URL: &url, Secret: &secret, Format: store.WebhookFormatE2B, Events: &[]string{"sandbox.lifecycle.created", "sandbox.lifecycle.running"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("an E2B type that does not exist: %v", err)
	}
	w, _, err := f.svc.Create(ctx, f.alice, webhooks.Spec{URL: &url, Secret: &secret, Format: store.WebhookFormatE2B})
	if err != nil {
		t.Fatal(err)
	}
	sb := f.sandbox(t, f.alice)
	if _, err := f.st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "killed", time.Now()); err != nil {
		t.Fatal(err)
	}
	until(t, "created and killed", func() bool { got, _, _ := r.received(); return len(got) == 2 })
	got, bodies, calls := r.received()
	if calls != 2 {
		t.Fatalf("%d deliveries: running has no E2B name and is not sent", calls)
	}
	types := map[string]bool{}
	for i := range got {
		var ev webhooks.E2BEvent
		if err := json.Unmarshal(bodies[i], &ev); err != nil || ev.SandboxID != "sbx-"+strings.TrimPrefix(sb.ID, "sbx_") || ev.Version != "v1" || ev.SandboxTeamID != f.alice {
			t.Fatalf("delivery %d: %s", i, bodies[i])
		}
		types[ev.Type] = true
		if got[i].Header.Get("e2b-signature") != webhooks.SignE2B([]byte(secret), bodies[i]) || got[i].Header.Get("e2b-webhook-id") != w.ID || got[i].Header.Get("e2b-signature-version") != "v1" {
			t.Fatalf("delivery %d's headers %v", i, got[i].Header)
		}
	}
	if !types["sandbox.lifecycle.created"] || !types["sandbox.lifecycle.killed"] {
		t.Fatalf("types %v", types)
	}
}

// TestWebhookGuards: a webhook URL the server may not reach is refused at
// registration (loopback and private addresses by default, a metadata
// service always, names that resolve to them, other schemes, credentials),
// and a delivery to one that resolves there later fails without a
// connection; another account cannot read, change or delete a webhook;
// deleting one cancels what it had not delivered; secrets are sealed in
// the store.
func TestWebhookGuards(t *testing.T) {
	securitytest.Attack(t, "webhooks", "a webhook URL aimed at the host, a private network or a cloud metadata service, by address or by a name that resolves there",
		"refused at registration (400), and each connection is checked again by the address guard, so a name that later resolves there is refused too; private addresses only with --webhooks-allow-private, metadata never")
	securitytest.Attack(t, "webhooks", "another account reads, changes or deletes alice's webhook, or reads its deliveries",
		"not found: a webhook is looked up within the account the caller acts for")
	f := newFixture(t, false)
	ctx := t.Context()
	for _, u := range []string{"http://127.0.0.1:9/x", "http://localhost:9/x", "http://10.1.2.3/x", "http://[::1]/x", "http://169.254.169.254/latest", "ftp://example.com/x",
		"https://user:pw@example.com/x", "https://example.com/#frag", "not a url", "https:///x"} {
		u := u
		if _, _, err := f.svc.Create(ctx, f.alice, webhooks.Spec{URL: &u}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("url %q: %v, want 400", u, err)
		}
	}
	allowed := newFixture(t, true)
	meta := "http://169.254.169.254/latest"
	if _, _, err := allowed.svc.Create(ctx, allowed.alice, webhooks.Spec{URL: &meta}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a metadata service with private addresses allowed: %v", err)
	}
	short := "short"
	good := "https://hooks.example/in"
	if _, _, err := f.svc.Create(ctx, f.alice, webhooks.Spec{URL: &good, Secret: &short}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a short secret: %v", err)
	}
	w, secret, err := f.svc.Create(ctx, f.alice, webhooks.Spec{URL: &good})
	if err != nil || !strings.HasPrefix(secret, "whsec_") {
		t.Fatalf("create: %v %q", err, secret)
	}
	if row, _ := f.st.GetWebhook(ctx, w.ID); strings.Contains(row.Secret, secret) || !strings.HasPrefix(row.Secret, "v1:") {
		t.Fatalf("the stored secret %q", row.Secret)
	}
	off := false
	if _, err := f.svc.Update(ctx, f.bob, w.ID, webhooks.Spec{Enabled: &off}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob changes it: %v", err)
	}
	if _, err := f.svc.Get(ctx, f.bob, w.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob reads it: %v", err)
	}
	if _, err := f.svc.Delete(ctx, f.bob, w.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob deletes it: %v", err)
	}

	// A name that resolves to loopback: refused at registration; one that
	// resolves there only later (DNS rebinding): its deliveries fail at
	// the connection, which never reaches the receiver.
	res := &resolver{addrs: map[string]string{"sneaky.example": "127.0.0.1"}}
	f2 := newFixtureWith(t, false, res)
	r := newReceiver(t)
	port := r.srv.URL[strings.LastIndex(r.srv.URL, ":"):]
	sneaky := "http://sneaky.example" + port + "/in"
	if _, _, err := f2.svc.Create(ctx, f2.alice, webhooks.Spec{URL: &sneaky}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a name resolving to loopback at registration: %v", err)
	}
	res.set("sneaky.example", "93.184.215.14")
	w2, _, err := f2.svc.Create(ctx, f2.alice, webhooks.Spec{URL: &sneaky, Events: &[]string{store.EventCreated}})
	if err != nil {
		t.Fatal(err)
	}
	res.set("sneaky.example", "127.0.0.1")
	f2.sandbox(t, f2.alice)
	until(t, "a refused attempt", func() bool {
		ds, _ := f2.svc.Deliveries(ctx, f2.alice, w2.ID, 10)
		return len(ds) == 1 && ds[0].Attempts > 0
	})
	ds, _ := f2.svc.Deliveries(ctx, f2.alice, w2.ID, 10)
	if !strings.Contains(ds[0].LastError, "address not allowed") {
		t.Fatalf("the rebound delivery: %+v", ds[0])
	}
	if _, _, calls := r.received(); calls != 0 {
		t.Fatalf("the receiver on loopback got %d requests", calls)
	}

	// Deleted: what it had not delivered is cancelled.
	if _, err := f2.svc.Delete(ctx, f2.alice, w2.ID); err != nil {
		t.Fatal(err)
	}
	if d, _ := f2.st.ListDeliveries(ctx, w2.ID, 10); len(d) != 1 || d[0].Status != store.DeliveryCancelled {
		t.Fatalf("after the delete: %+v", d)
	}
}
