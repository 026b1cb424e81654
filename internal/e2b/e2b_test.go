package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// fakeSandboxes stands in for the sandbox manager: rows in the real
// store, and every sandbox's agent is one fake agent (agentHandler).
type fakeSandboxes struct {
	st      *store.Store
	node    string
	mu      sync.Mutex
	last    sandbox.CreateRequest
	network *netpol.Policy
	// netErr, when set, is what SetNetwork fails with.
	netErr error
	// usage is what UsageHistory keeps of every sandbox.
	usage []sandbox.UsageSample
	// vols, when set, resolves a create's volumes and releases them at
	// the stop, as the manager and the volumes hook do (no disk is made).
	vols *volumes.Service
}

func (f *fakeSandboxes) Create(ctx context.Context, accountID string, req sandbox.CreateRequest) (store.Sandbox, string, error) {
	f.mu.Lock()
	f.last = req
	f.mu.Unlock()
	if req.Template != "" {
		// As the manager resolves it (templates.Service.Find).
		name, tag, _ := strings.Cut(req.Template, ":")
		t, err := f.st.FindTemplate(ctx, accountID, name, tag)
		switch {
		case err != nil:
			return store.Sandbox{}, "", errdefs.Newf(errdefs.ErrNotFound, "template %s not found", req.Template)
		case t.Status == store.TemplateBuilding:
			return store.Sandbox{}, "", errdefs.Newf(errdefs.ErrConflict, "template %s is still building; try again when it is ready", req.Template)
		case t.Status == store.TemplateFailed:
			return store.Sandbox{}, "", errdefs.Newf(errdefs.ErrConflict, "template %s failed to build: %s", req.Template, t.FailureReason)
		}
	}
	now := time.Now()
	sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: accountID, NodeID: f.node, Status: store.SandboxRunning, Runtime: "fake", CreatedAt: now, Deadline: now.Add(5 * time.Minute), OnTimeout: req.OnTimeout}
	if len(req.Volumes) > 0 {
		if f.vols == nil {
			return store.Sandbox{}, "", errdefs.New(errdefs.ErrInvalid, "volumes are not enabled on this server")
		}
		atts, err := f.vols.Resolve(ctx, accountID, req.Volumes)
		if err != nil {
			return store.Sandbox{}, "", err
		}
		sb.Volumes = atts
	}
	if err := f.st.CreateSandbox(ctx, &sb); err != nil {
		var busy *store.VolumeBusyError
		if errors.As(err, &busy) {
			return store.Sandbox{}, "", errdefs.New(errdefs.ErrConflict, busy.Error())
		}
		return store.Sandbox{}, "", err
	}
	return sb, "", nil
}

func (f *fakeSandboxes) Live(_ context.Context, sbs []store.Sandbox) []store.Sandbox { return sbs }

func (f *fakeSandboxes) Stop(ctx context.Context, _ auth.Principal, id string) (store.Sandbox, error) {
	sb, err := f.st.GetSandbox(ctx, id)
	if err != nil {
		return sb, err
	}
	_, err = f.st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", time.Now())
	sb.Status = store.SandboxStopped
	if err == nil && f.vols != nil {
		err = f.vols.Stop(ctx, sb.ID)
	}
	return sb, err
}

func (f *fakeSandboxes) SetTimeout(ctx context.Context, _ auth.Principal, id string, d time.Duration) (store.Sandbox, error) {
	sb, err := f.st.GetSandbox(ctx, id)
	sb.Deadline = time.Now().Add(d)
	return sb, err
}

func (f *fakeSandboxes) Pause(context.Context, auth.Principal, string) (store.Sandbox, error) {
	return store.Sandbox{}, errdefs.New(errdefs.ErrInvalid, "the fake does not pause")
}

func (f *fakeSandboxes) PauseFiles(context.Context, auth.Principal, string) (store.Sandbox, error) {
	return store.Sandbox{}, errdefs.New(errdefs.ErrInvalid, "the fake does not pause")
}

func (f *fakeSandboxes) Resume(context.Context, auth.Principal, string) (store.Sandbox, error) {
	return store.Sandbox{}, errdefs.New(errdefs.ErrInvalid, "the fake does not resume")
}

func (f *fakeSandboxes) Stats(context.Context, auth.Principal, string) (runtime.Stats, error) {
	return runtime.Stats{MemoryBytes: 64 << 20, CPU: time.Second, DiskBytes: 1 << 20}, nil
}

func (f *fakeSandboxes) UsageHistory(_ context.Context, _ auth.Principal, _ string, from, to time.Time) ([]sandbox.UsageSample, error) {
	var out []sandbox.UsageSample
	for _, s := range f.usage {
		if (from.IsZero() || !s.At.Before(from)) && (to.IsZero() || !s.At.After(to)) {
			out = append(out, s)
		}
	}
	return out, nil
}

func (f *fakeSandboxes) Fork(ctx context.Context, _ auth.Principal, id string, count int, lifetime time.Duration) ([]store.Sandbox, error) {
	parent, err := f.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []store.Sandbox
	for range count {
		sb, _, err := f.Create(ctx, parent.AccountID, sandbox.CreateRequest{Lifetime: lifetime})
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, nil
}

func (f *fakeSandboxes) SetNetwork(ctx context.Context, _ auth.Principal, id string, p netpol.Policy) (store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.netErr != nil {
		return store.Sandbox{}, f.netErr
	}
	f.network = &p
	return f.st.GetSandbox(ctx, id)
}

func (f *fakeSandboxes) AgentTransport(context.Context, auth.Principal, string) (http.RoundTripper, error) {
	return nil, errdefs.ErrNotRunning
}

type fixture struct {
	t        *testing.T
	api      *API
	srv      *httptest.Server
	st       *store.Store
	sbs      *fakeSandboxes
	key      string // alice's
	otherKey string // bob's
	now      time.Time
}

// fixtureOptions are the API's options and the cluster its gate routes
// through (nil: a single node).
type fixtureOptions struct {
	Options
	cluster edge.Cluster
}

// newFixture serves the API over a real store; with, when given, changes
// its options first.
func newFixture(t *testing.T, with ...func(*fixtureOptions)) *fixture {
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	f := &fixture{t: t, st: st, now: time.Now()}
	f.sbs = &fakeSandboxes{st: st, node: "n1"}
	opts := fixtureOptions{Options: Options{Sandboxes: f.sbs, Store: st, NodeID: "n1", CPUs: 2, MemoryMB: 512, Now: func() time.Time { return f.now }}}
	for _, w := range with {
		w(&opts)
	}
	gate, err := edge.NewGate(auth.NewAuthenticator(st), opts.cluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts.Gate = gate
	api, err := New(opts.Options)
	if err != nil {
		t.Fatal(err)
	}
	f.api = api
	mux := http.NewServeMux()
	for pattern, h := range api.Routes() {
		mux.Handle(strings.TrimSuffix(pattern, "*"), h)
	}
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	f.key = f.account("alice")
	f.otherKey = f.account("bob")
	return f
}

// account creates an account and returns a key of it in E2B's form.
func (f *fixture) account(name string) string {
	a := store.Account{Name: name, Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(f.t.Context(), &a); err != nil {
		f.t.Fatal(err)
	}
	plaintext, prefix, hash, err := auth.NewE2BKey()
	if err != nil {
		f.t.Fatal(err)
	}
	if err := f.st.CreateAPIKey(f.t.Context(), &store.APIKey{AccountID: a.ID, Name: "k", Prefix: prefix, Hash: hash}); err != nil {
		f.t.Fatal(err)
	}
	return plaintext
}

// call sends a request and decodes a JSON answer into out (when not nil).
func (f *fixture) call(method, path string, headers map[string]string, body any, out any) *http.Response {
	f.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	req, _ := http.NewRequest(method, f.srv.URL+path, rd)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			f.t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp
}

func (f *fixture) create(key string, body map[string]any) sandboxResponse {
	f.t.Helper()
	var sb sandboxResponse
	if resp := f.call("POST", "/v2/sandboxes", map[string]string{"X-API-Key": key}, body, &sb); resp.StatusCode != http.StatusCreated {
		f.t.Fatalf("create: %d", resp.StatusCode)
	}
	return sb
}

func TestControlPlaneAuthAndErrors(t *testing.T) {
	f := newFixture(t)
	var e envd.Error
	for _, h := range []map[string]string{nil, {"X-API-Key": "e2b_00"}, {"X-API-Key": f.key, "Authorization": "Bearer " + f.key}} {
		if resp := f.call("GET", "/v2/sandboxes", h, nil, &e); resp.StatusCode != 401 || e.Code != 401 {
			t.Fatalf("list with %v: %d %+v, want 401 in E2B's shape", h, resp.StatusCode, e)
		}
	}
	key := map[string]string{"X-API-Key": f.key}
	cases := []struct {
		body map[string]any
		code int
	}{
		{map[string]any{"templateID": "nope"}, 404},
		{map[string]any{"templateID": "base", "envVars": map[string]string{"1BAD": "x"}}, 400},
		{map[string]any{"templateID": "base", "network": map[string]any{"denyOut": []string{"1.2.3.4"}}}, 400},
		{map[string]any{"templateID": "base", "timeout": 0}, 400},
		// keepMemory false is only a pause's, and never resumed by
		// traffic.
		{map[string]any{"templateID": "base", "autoPauseMemory": false}, 400},
		{map[string]any{"templateID": "base", "autoPause": true, "autoPauseMemory": false, "autoResume": map[string]any{"enabled": true}}, 400},
	}
	for _, c := range cases {
		if resp := f.call("POST", "/v2/sandboxes", key, c.body, &e); resp.StatusCode != c.code || e.Code != c.code {
			t.Errorf("create %v: %d %+v, want %d", c.body, resp.StatusCode, e, c.code)
		}
	}
	// Options sandboxd does not implement are refused, each named, never
	// accepted and ignored; values that ask for nothing pass.
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"mcp": map[string]any{"github": map[string]any{}}}, "mcp"},
		{map[string]any{"iam": map[string]any{"tokens": map[string]any{"t": "x"}}}, "iam"},
		{map[string]any{"network": map[string]any{"rules": map[string]any{"a.com": []any{}}}}, "network.rules"},
		{map[string]any{"network": map[string]any{"egressProxy": map[string]any{"address": "p:1080"}}}, "network.egressProxy"},
		{map[string]any{"network": map[string]any{"maskRequestHost": "x.{PORT}"}}, "network.maskRequestHost"},
		{map[string]any{"network": map[string]any{"httpsPorts": []int{443}}}, "network.httpsPorts"},
	} {
		c.body["templateID"] = "base"
		if resp := f.call("POST", "/v2/sandboxes", key, c.body, &e); resp.StatusCode != 400 || !strings.Contains(e.Message, "not supported by sandboxd: "+c.want+" (") {
			t.Errorf("create %v: %d %+v, want 400 naming %s", c.body, resp.StatusCode, e, c.want)
		}
	}
	// autoResume is taken with autoPause only.
	if resp := f.call("POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "autoResume": map[string]any{"enabled": true}}, &e); resp.StatusCode != 400 || !strings.Contains(e.Message, "autoResume: only with autoPause") {
		t.Errorf("autoResume without autoPause: %d %+v", resp.StatusCode, e)
	}
	var resumable sandboxResponse
	if resp := f.call("POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "autoPause": true, "autoResume": map[string]any{"enabled": true}}, &resumable); resp.StatusCode != 201 {
		t.Errorf("autoResume with autoPause: %d", resp.StatusCode)
	}
	var detail map[string]any
	f.call("GET", "/sandboxes/"+resumable.SandboxID, key, nil, &detail)
	if lc, _ := detail["lifecycle"].(map[string]any); lc["autoResume"] != true || lc["onTimeout"] != "pause" {
		t.Errorf("lifecycle %v", detail["lifecycle"])
	}
	var made map[string]any
	if resp := f.call("POST", "/v2/sandboxes", key, map[string]any{"templateID": "base", "autoResume": map[string]any{"enabled": false}, "volumeMounts": []any{}, "mcp": nil}, &made); resp.StatusCode != 201 {
		t.Errorf("create with options that ask for nothing: %d %v", resp.StatusCode, made)
	}
	if resp := f.call("GET", "/sandboxes/sbx_missing", key, nil, &e); resp.StatusCode != 404 {
		t.Fatalf("get missing: %d", resp.StatusCode)
	}
	if resp := f.call("DELETE", "/sandboxes/sbx_missing", key, nil, &e); resp.StatusCode != 404 || e.Code != 404 {
		t.Fatalf("kill missing: %d %+v (the SDK's kill() reads code 404 as false)", resp.StatusCode, e)
	}
}

func TestControlPlaneLifecycle(t *testing.T) {
	f := newFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	sb := f.create(f.key, map[string]any{"templateID": "base", "timeout": 60, "metadata": map[string]string{"team": "a"}, "envVars": map[string]string{"FOO": "bar"}})
	if !strings.HasPrefix(sb.SandboxID, "sbx-") || sb.TemplateID != "base" || sb.EnvdVersion != EnvdVersion || len(sb.EnvdAccessToken) != 64 || sb.ClientID == "" {
		t.Fatalf("create answered %+v", sb)
	}
	if f.sbs.last.Lifetime != time.Minute {
		t.Fatalf("create asked the manager for a lifetime of %v, want 1m", f.sbs.last.Lifetime)
	}
	f.create(f.key, map[string]any{"templateID": "base", "metadata": map[string]string{"team": "b"}, "autoPause": true})
	if f.sbs.last.OnTimeout != store.OnTimeoutPause {
		t.Fatalf("autoPause asked the manager for on-timeout %q, want pause", f.sbs.last.OnTimeout)
	}
	f.create(f.otherKey, map[string]any{"metadata": map[string]string{"team": "a"}})

	var detail sandboxDetail
	if resp := f.call("GET", "/sandboxes/"+sb.SandboxID, key, nil, &detail); resp.StatusCode != 200 ||
		detail.Metadata["team"] != "a" || detail.State != "running" || detail.CPUCount != 2 || detail.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("get: %d %+v", resp.StatusCode, detail)
	}
	// Another account's key sees nothing of it.
	other := map[string]string{"X-API-Key": f.otherKey}
	if resp := f.call("GET", "/sandboxes/"+sb.SandboxID, other, nil, nil); resp.StatusCode != 404 {
		t.Fatalf("get by another account: %d, want 404", resp.StatusCode)
	}
	if resp := f.call("DELETE", "/sandboxes/"+sb.SandboxID, other, nil, nil); resp.StatusCode != 404 {
		t.Fatalf("kill by another account: %d, want 404", resp.StatusCode)
	}

	var list []listedSandbox
	filter := url.QueryEscape(url.Values{"team": {"a"}}.Encode())
	f.call("GET", "/v2/sandboxes?metadata="+filter, key, nil, &list)
	if len(list) != 1 || list[0].SandboxID != sb.SandboxID {
		t.Fatalf("list with metadata team=a: %+v", list)
	}
	resp := f.call("GET", "/v2/sandboxes?limit=1", key, nil, &list)
	next := resp.Header.Get("X-Next-Token")
	if len(list) != 1 || next == "" {
		t.Fatalf("first page of 1: %d sandboxes, next token %q", len(list), next)
	}
	first := list[0].SandboxID
	resp = f.call("GET", "/v2/sandboxes?limit=1&nextToken="+next, key, nil, &list)
	if len(list) != 1 || list[0].SandboxID == first || resp.Header.Get("X-Next-Token") != "" {
		t.Fatalf("second page: %+v, next %q", list, resp.Header.Get("X-Next-Token"))
	}
	// order, startedAfter and template select and sort; X-Total-Running
	// counts the running ones that match, before paging.
	ids := func(query string) ([]string, *http.Response) {
		t.Helper()
		var l []listedSandbox
		resp := f.call("GET", "/v2/sandboxes"+query, key, nil, &l)
		if resp.StatusCode != 200 {
			t.Fatalf("list %s: %d", query, resp.StatusCode)
		}
		var out []string
		for _, s := range l {
			out = append(out, s.SandboxID)
		}
		return out, resp
	}
	desc, resp := ids("")
	asc, _ := ids("?order=asc")
	if len(desc) != 2 || !slices.Equal(asc, []string{desc[1], desc[0]}) || resp.Header.Get("X-Total-Running") != "2" {
		t.Fatalf("desc %v, asc %v, total running %q", desc, asc, resp.Header.Get("X-Total-Running"))
	}
	if page, resp := ids("?order=asc&limit=1"); !slices.Equal(page, asc[:1]) || resp.Header.Get("X-Total-Running") != "2" {
		t.Fatalf("the first page of one, oldest first: %v, total %q", page, resp.Header.Get("X-Total-Running"))
	}
	if got, _ := ids("?startedAfter=" + url.QueryEscape(f.now.Add(time.Second).Format(time.RFC3339Nano))); len(got) != 0 {
		t.Fatalf("started after a second from now: %v", got)
	}
	if got, _ := ids("?startedAfter=" + url.QueryEscape(f.now.Add(-time.Second).Format(time.RFC3339Nano))); len(got) != 2 {
		t.Fatalf("started after a second ago: %v", got)
	}
	if got, _ := ids("?template=base"); len(got) != 2 {
		t.Fatalf("template base: %v", got)
	}
	if got, _ := ids("?template=other"); len(got) != 0 {
		t.Fatalf("template other: %v", got)
	}
	if _, resp := ids("?state=paused"); resp.Header.Get("X-Total-Running") != "" {
		t.Fatalf("X-Total-Running without running asked for: %q", resp.Header.Get("X-Total-Running"))
	}
	for _, bad := range []string{"?order=up", "?startedAfter=yesterday"} {
		if resp := f.call("GET", "/v2/sandboxes"+bad, key, nil, nil); resp.StatusCode != 400 {
			t.Errorf("list %s: %d, want 400", bad, resp.StatusCode)
		}
	}

	var metrics []metric
	f.now = time.Now().Add(10 * time.Second) // 1s of CPU over 10s on 2 CPUs: 5%
	if resp := f.call("GET", "/sandboxes/"+sb.SandboxID+"/metrics", key, nil, &metrics); resp.StatusCode != 200 || len(metrics) != 1 ||
		metrics[0].MemUsed != 64<<20 || metrics[0].MemTotal != 512<<20 || metrics[0].CPUCount != 2 || metrics[0].CPUUsedPct < 4.9 || metrics[0].CPUUsedPct > 5.1 {
		t.Fatalf("metrics: %d %+v", resp.StatusCode, metrics)
	}
	if resp := f.call("POST", "/sandboxes/"+sb.SandboxID+"/timeout", key, map[string]any{"timeout": 30}, nil); resp.StatusCode != 204 {
		t.Fatalf("set timeout: %d", resp.StatusCode)
	}
	var conn sandboxResponse
	if resp := f.call("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", key, map[string]any{"timeout": 30}, &conn); resp.StatusCode != 200 || conn.EnvdAccessToken != sb.EnvdAccessToken {
		t.Fatalf("connect to a running sandbox: %d %+v, want 200 and its token", resp.StatusCode, conn)
	}
	var forks []forkResult
	if resp := f.call("POST", "/sandboxes/"+sb.SandboxID+"/fork", key, map[string]any{"count": 2}, &forks); resp.StatusCode != 201 || len(forks) != 2 ||
		forks[0].Sandbox == nil || forks[0].Sandbox.EnvdAccessToken == sb.EnvdAccessToken || forks[0].Sandbox.EnvdAccessToken == forks[1].Sandbox.EnvdAccessToken {
		t.Fatalf("fork of 2: %d %+v, want two children with tokens of their own", resp.StatusCode, forks)
	}
	var child sandboxDetail
	f.call("GET", "/sandboxes/"+forks[0].Sandbox.SandboxID, key, nil, &child)
	if child.Metadata["team"] != "a" {
		t.Fatalf("a fork's metadata: %+v, want its parent's", child.Metadata)
	}
	if resp := f.call("PUT", "/sandboxes/"+sb.SandboxID+"/network", key, map[string]any{"allowOut": []string{"10.1.2.3"}, "denyOut": []string{"1.1.1.1"}}, nil); resp.StatusCode != 400 {
		t.Fatalf("network update with denyOut: %d, want 400", resp.StatusCode)
	}
	if resp := f.call("PUT", "/sandboxes/"+sb.SandboxID+"/network", key, map[string]any{"allow_internet_access": false}, nil); resp.StatusCode != 204 || f.sbs.network == nil || f.sbs.network.Mode != netpol.ModeNone {
		t.Fatalf("network update to no internet: %d %+v", resp.StatusCode, f.sbs.network)
	}
	if resp := f.call("DELETE", "/sandboxes/"+sb.SandboxID, key, nil, nil); resp.StatusCode != 204 {
		t.Fatalf("kill: %d", resp.StatusCode)
	}
	if resp := f.call("DELETE", "/sandboxes/"+sb.SandboxID, key, nil, nil); resp.StatusCode != 404 {
		t.Fatalf("kill again: %d, want 404", resp.StatusCode)
	}
	if resp := f.call("POST", "/v2/sandboxes/"+sb.SandboxID+"/connect", key, nil, nil); resp.StatusCode != 404 {
		t.Fatalf("connect to a killed sandbox: %d, want 404", resp.StatusCode)
	}
}

// TestCausesNeverReachTheBody: what an E2B client is told of a failure is
// the edge's explanation (edge.Explain), in E2B's shape: the user message
// of the error's class, never the cause below it (netpol's text, a store
// error), which only the log gets.
func TestCausesNeverReachTheBody(t *testing.T) {
	f := newFixture(t)
	sb := f.create(f.key, nil)
	key := map[string]string{"X-API-Key": f.key}
	for _, c := range []struct {
		err  error
		code int
		msg  string
	}{
		{errdefs.Wrap(errdefs.ErrInvalid, errors.New("nft: secret detail"), "bad policy"), 400, "bad policy"},
		{fmt.Errorf("update rules: nft: secret detail"), 500, edge.InternalMessage},
	} {
		f.sbs.mu.Lock()
		f.sbs.netErr = c.err
		f.sbs.mu.Unlock()
		var e envd.Error
		resp := f.call("PUT", "/sandboxes/"+sb.SandboxID+"/network", key, map[string]any{"allow_internet_access": false}, &e)
		if resp.StatusCode != c.code || e.Code != c.code || e.Message != c.msg {
			t.Errorf("SetNetwork failing with %q answered %d %+v, want %d %q", c.err, resp.StatusCode, e, c.code, c.msg)
		}
		if strings.Contains(e.Message, "secret") || strings.Contains(e.Message, "nft") {
			t.Errorf("the cause reached the client: %+v", e)
		}
	}
}

// TestFailedSandboxSaysWhy: a sandbox that failed is not found, as any
// that ended is (the SDKs know no other state, and read 404 as ended), but
// its 404 says why, in its message and as failureReason; one that stopped
// has no reason to give.
func TestFailedSandboxSaysWhy(t *testing.T) {
	f := newFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	failed, stopped := f.create(f.key, nil), f.create(f.key, nil)
	const reason = "its node stopped answering (no heartbeat for 30s); its processes and unsaved work are lost"
	if _, err := f.st.TransitionSandbox(t.Context(), envd.SandboxID(failed.SandboxID), []store.SandboxStatus{store.SandboxRunning}, store.SandboxFailed, reason, time.Now()); err != nil {
		t.Fatal(err)
	}
	var e envd.Error
	if resp := f.call("GET", "/sandboxes/"+failed.SandboxID, key, nil, &e); resp.StatusCode != 404 || e.Code != 404 ||
		e.FailureReason != reason || e.Message != fmt.Sprintf("sandbox %q failed: %s", failed.SandboxID, reason) {
		t.Fatalf("get a failed sandbox: %d %+v", resp.StatusCode, e)
	}
	// Its other routes too: kill() of it returns false with the reason.
	if resp := f.call("DELETE", "/sandboxes/"+failed.SandboxID, key, nil, &e); resp.StatusCode != 404 || e.FailureReason != reason {
		t.Fatalf("kill a failed sandbox: %d %+v", resp.StatusCode, e)
	}
	// Another account learns nothing of it.
	e = envd.Error{}
	if resp := f.call("GET", "/sandboxes/"+failed.SandboxID, map[string]string{"X-API-Key": f.otherKey}, nil, &e); resp.StatusCode != 404 || e.FailureReason != "" || strings.Contains(e.Message, "failed") {
		t.Fatalf("get another account's failed sandbox: %d %+v", resp.StatusCode, e)
	}
	f.call("DELETE", "/sandboxes/"+stopped.SandboxID, key, nil, nil)
	e = envd.Error{}
	if resp := f.call("GET", "/sandboxes/"+stopped.SandboxID, key, nil, &e); resp.StatusCode != 404 || e.FailureReason != "" {
		t.Fatalf("get a stopped sandbox: %d %+v", resp.StatusCode, e)
	}
}

// fakeCluster hosts the sandboxes named in remote on node "n2" and
// records what was forwarded there.
type fakeCluster struct {
	remote   map[string]bool
	placeOn  string // "" places here
	mu       sync.Mutex
	forwards []forwarded
}

type forwarded struct {
	node, keyID, path, body string
	placed                  bool
}

func (c *fakeCluster) Forwarded(*http.Request) (string, bool, error) { return "", false, nil }

func (c *fakeCluster) HostOf(_ context.Context, id string) (string, bool) {
	return "n2", c.remote[id]
}

func (c *fakeCluster) Place(context.Context, *netpol.Policy) (string, bool, error) {
	return c.placeOn, c.placeOn == "", nil
}

func (c *fakeCluster) Forward(w http.ResponseWriter, r *http.Request, node, keyID string, placed bool) {
	b, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	c.forwards = append(c.forwards, forwarded{node: node, keyID: keyID, path: r.URL.Path, body: string(b), placed: placed})
	c.mu.Unlock()
	w.WriteHeader(http.StatusTeapot)
}

func (c *fakeCluster) Do(*http.Request, string, string, bool) (*http.Response, error) {
	return nil, errors.New("unused")
}

func (c *fakeCluster) last() forwarded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.forwards[len(c.forwards)-1]
}

// In a cluster, requests for a sandbox another node hosts go there, and
// creates go where placement puts them.
func TestClusterRouting(t *testing.T) {
	c := &fakeCluster{remote: map[string]bool{}}
	f := newFixture(t, func(o *fixtureOptions) { o.cluster = c })
	sb := f.create(f.key, nil)
	c.remote[envd.SandboxID(sb.SandboxID)] = true
	key := map[string]string{"X-API-Key": f.key}

	if resp := f.call("DELETE", "/sandboxes/"+sb.SandboxID, key, nil, nil); resp.StatusCode != http.StatusTeapot {
		t.Fatalf("kill of a sandbox hosted elsewhere: %d, want it forwarded", resp.StatusCode)
	}
	if got := c.last(); got.node != "n2" || got.keyID == "" || got.path != "/sandboxes/"+sb.SandboxID {
		t.Fatalf("forwarded %+v", got)
	}
	// Another account's key is refused before anything is forwarded.
	n := len(c.forwards)
	if resp := f.call("DELETE", "/sandboxes/"+sb.SandboxID, map[string]string{"X-API-Key": "e2b_bad"}, nil, nil); resp.StatusCode != 401 || len(c.forwards) != n {
		t.Fatalf("a bad key: %d, %d forwards", resp.StatusCode, len(c.forwards)-n)
	}

	c.placeOn = "n3"
	body := map[string]any{"templateID": "base", "metadata": map[string]string{"k": "v"}}
	if resp := f.call("POST", "/v2/sandboxes", key, body, nil); resp.StatusCode != http.StatusTeapot {
		t.Fatalf("create placed elsewhere: %d, want it forwarded", resp.StatusCode)
	}
	if got := c.last(); got.node != "n3" || !got.placed || !strings.Contains(got.body, `"k":"v"`) {
		t.Fatalf("forwarded create %+v, want placed on n3 with its body", got)
	}
}

// Sandbox ids are DNS labels in the E2B API ("sbx-..."), and sandboxd's
// own form is taken too.
func TestE2BIDs(t *testing.T) {
	f := newFixture(t)
	sb := f.create(f.key, nil)
	if !regexp.MustCompile(`^[a-z0-9-]{1,63}$`).MatchString(sb.SandboxID) {
		t.Fatalf("sandbox id %q is not a DNS label", sb.SandboxID)
	}
	key := map[string]string{"X-API-Key": f.key}
	for _, id := range []string{sb.SandboxID, envd.SandboxID(sb.SandboxID)} {
		var d sandboxDetail
		if resp := f.call("GET", "/sandboxes/"+id, key, nil, &d); resp.StatusCode != 200 || d.SandboxID != sb.SandboxID {
			t.Fatalf("get by %s: %d %+v", id, resp.StatusCode, d.listedSandbox)
		}
	}
	var list []listedSandbox
	if f.call("GET", "/v2/sandboxes", key, nil, &list); len(list) != 1 || list[0].SandboxID != sb.SandboxID {
		t.Fatalf("list: %+v", list)
	}
}

// TestRoutePatterns: mounted on a chi router as the API server mounts
// them, the control plane's requests are named by their own route pattern
// in metrics and logs, not by the mount point's joined to it.
func TestRoutePatterns(t *testing.T) {
	f := newFixture(t)
	var got string
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			next.ServeHTTP(w, req)
			got = chi.RouteContext(req.Context()).RoutePattern()
		})
	})
	for pattern, h := range f.api.Routes() {
		r.Handle(pattern, h)
	}
	for path, want := range map[string]string{
		"/v2/sandboxes":               "/v2/sandboxes",
		"/sandboxes":                  "/sandboxes",
		"/sandboxes/sbx-x":            "/sandboxes/{id}",
		"/sandboxes/sbx-x/metrics":    "/sandboxes/{id}/metrics",
		"/templates":                  "/templates",
		"/health":                     "/health",
		"/filesystem.Filesystem/Stat": "/filesystem.Filesystem/*",
	} {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("X-API-Key", f.key)
		r.ServeHTTP(httptest.NewRecorder(), req)
		if got != want {
			t.Errorf("GET %s is named %q, want %q", path, got, want)
		}
	}
}

// TestMetricsHistory: getMetrics({start, end}) answers the samples the
// node kept within the range (each one's CPU share over the span since the
// one before), and a measure taken now only when the range reaches now;
// without a range, the whole history and now; a bad range is 400.
func TestMetricsHistory(t *testing.T) {
	f := newFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	sb := f.create(f.key, map[string]any{"templateID": "base"})
	row, err := f.st.GetSandbox(t.Context(), envd.SandboxID(sb.SandboxID))
	if err != nil {
		t.Fatal(err)
	}
	t0 := row.CreatedAt.Truncate(time.Second).Add(time.Second)
	// Two CPUs: one second of CPU over 10 s is 5%, three over 10 s 15%.
	f.sbs.usage = []sandbox.UsageSample{
		{At: t0.Add(10 * time.Second), CPU: time.Second, MemoryBytes: 1 << 20},
		{At: t0.Add(20 * time.Second), CPU: 4 * time.Second, MemoryBytes: 2 << 20},
		{At: t0.Add(30 * time.Second), CPU: 4 * time.Second, MemoryBytes: 3 << 20},
	}
	f.now = t0.Add(40 * time.Second)
	get := func(query string) ([]metric, int) {
		t.Helper()
		var out []metric
		resp := f.call("GET", "/sandboxes/"+sb.SandboxID+"/metrics"+query, key, nil, &out)
		return out, resp.StatusCode
	}
	unix := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }
	got, code := get("?start=" + unix(15*time.Second) + "&end=" + unix(30*time.Second))
	if code != 200 || len(got) != 2 || got[0].MemUsed != 2<<20 || got[0].CPUUsedPct < 14.9 || got[0].CPUUsedPct > 15.1 || got[1].CPUUsedPct != 0 {
		t.Fatalf("a past range: %d %+v", code, got)
	}
	if got, code := get(""); code != 200 || len(got) != 4 || got[3].MemUsed != 64<<20 {
		t.Fatalf("no range: %d %+v", code, got)
	}
	if got, _ := get("?start=" + unix(25*time.Second)); len(got) != 2 {
		t.Fatalf("from a time on (now included): %+v", got)
	}
	for _, bad := range []string{"?start=yesterday", "?end=-1", "?start=" + unix(20*time.Second) + "&end=" + unix(10*time.Second)} {
		if resp := f.call("GET", "/sandboxes/"+sb.SandboxID+"/metrics"+bad, key, nil, nil); resp.StatusCode != 400 {
			t.Errorf("%s: %d, want 400", bad, resp.StatusCode)
		}
	}
}
