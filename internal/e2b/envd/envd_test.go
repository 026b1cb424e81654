package envd

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/guest"
	pb "github.com/sandboxd/sandboxd/internal/guest/pb/process"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// fakeAgents stands in for the sandbox manager: the agent of every
// running sandbox of the caller's account is one fake agent
// (newFakeAgent).
type fakeAgents struct {
	st    *store.Store
	agent http.Handler
}

func (f fakeAgents) AgentTransport(ctx context.Context, p auth.Principal, id string) (http.RoundTripper, error) {
	sb, err := f.st.GetSandbox(ctx, id)
	if err != nil || sb.AccountID != p.AccountID {
		return nil, errdefs.ErrNotFound
	}
	if sb.Status != store.SandboxRunning {
		return nil, errdefs.ErrNotRunning
	}
	return handlerTransport{f.agent}, nil
}

// ExecDefaults and TemplateEnv give sandboxes of the template tpl_app its
// directory, user and environment; the others none.
func (f fakeAgents) ExecDefaults(_ context.Context, sb store.Sandbox) (cwd, user string, err error) {
	if sb.TemplateID == "tpl_app" {
		return "/srv/app", "app", nil
	}
	return "", "", nil
}

func (f fakeAgents) TemplateEnv(_ context.Context, sb store.Sandbox) ([]string, error) {
	if sb.TemplateID == "tpl_app" {
		return []string{"APP=1", "FOO=template"}, nil
	}
	return nil, nil
}

// handlerTransport serves requests with a handler in process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// fakeAgent records what reached it: /files answers the headers it got,
// Start echoes the environment and user it was given.
type fakeAgent struct {
	processconnect.UnimplementedProcessHandler
}

func (fakeAgent) Start(_ context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	out := fmt.Sprintf("user=%s env=%v", req.Header().Get(userHeader), req.Msg.GetProcess().GetEnvs())
	if cwd := req.Msg.GetProcess().GetCwd(); cwd != "" {
		out += " cwd=" + cwd
	}
	return stream.Send(&pb.StartResponse{Event: &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: []byte(out)}}}}})
}

func newFakeAgent() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(fakeAgent{}))
	mux.HandleFunc("/files", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{
			"path": r.URL.Query().Get("path"), "user": r.Header.Get(userHeader),
			"token": r.Header.Get(headerAccessToken), "authz": r.Header.Get("Authorization"),
		})
	})
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	// The code interpreter answers what reached it.
	mux.HandleFunc(guest.CodePath+"/", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"path": r.URL.Path, "query": r.URL.RawQuery, "user": r.Header.Get(userHeader), "dir": r.Header.Get(guest.CodeDirHeader),
			"env": r.Header.Values(guest.CodeEnvHeader), "token": r.Header.Get(headerAccessToken), "traffic": r.Header.Get(headerTrafficToken),
		})
	})
	return mux
}

// fakeCluster hosts the sandboxes named in remote on node "n2" and
// records what was forwarded there; every request on its listener is
// signed.
type fakeCluster struct {
	remote   map[string]bool
	mu       sync.Mutex
	forwards []forwarded
}

type forwarded struct {
	node, keyID, path, user, host string
}

func (c *fakeCluster) Forwarded(*http.Request) (string, bool, error) { return "", false, nil }

func (c *fakeCluster) HostOf(_ context.Context, id string) (string, bool) {
	return "n2", c.remote[id]
}

func (c *fakeCluster) Place(context.Context, *netpol.Policy) (string, bool, error) {
	return "", true, nil
}

func (c *fakeCluster) Forward(w http.ResponseWriter, r *http.Request, node, keyID string, _ bool) {
	c.mu.Lock()
	c.forwards = append(c.forwards, forwarded{node: node, keyID: keyID, path: r.URL.Path, user: r.Header.Get(userHeader), host: r.Header.Get(headerForwardedHost)})
	c.mu.Unlock()
	w.WriteHeader(http.StatusTeapot)
}

func (c *fakeCluster) Do(*http.Request, string, string, bool) (*http.Response, error) {
	return nil, fmt.Errorf("unused")
}

func (c *fakeCluster) last() forwarded {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.forwards[len(c.forwards)-1]
}

// fakePorts records the port requests the host router made.
type fakePorts struct{ got []string }

func (p *fakePorts) ServePort(w http.ResponseWriter, r *http.Request, id string, port int, closed func(http.ResponseWriter)) {
	p.got = append(p.got, fmt.Sprintf("%s:%d%s host=%s token=%q", id, port, r.URL.Path, r.Host, r.Header.Get(headerTrafficToken)))
	if port == closedPort {
		closed(w)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// closedPort is a port fakePorts finds nothing listening on.
const closedPort = 3999

type fixture struct {
	t       *testing.T
	st      *store.Store
	proxy   *Proxy
	srv     *httptest.Server
	ports   *fakePorts
	account string
	now     time.Time
}

// newFixture serves the plane over a real store, on the domain sbx.test,
// in a cluster when c is not nil.
func newFixture(t *testing.T, c *fakeCluster) *fixture {
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	f := &fixture{t: t, st: st, now: time.Now(), ports: &fakePorts{}}
	var cluster edge.Cluster
	if c != nil {
		cluster = c
	}
	gate, err := edge.NewGate(auth.NewAuthenticator(st), cluster, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.proxy, err = New(Options{Agents: fakeAgents{st, newFakeAgent()}, Store: st, Gate: gate,
		NodeID: "n1", Domain: "sbx.test.", Ports: f.ports, Now: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	for pattern, h := range f.proxy.Routes() {
		mux.Handle(strings.TrimSuffix(pattern, "*"), h)
	}
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	a := store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(t.Context(), &a); err != nil {
		t.Fatal(err)
	}
	f.account = a.ID
	return f
}

func token(t *testing.T) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// sandbox starts a sandbox as the control plane records one: its row,
// running on this node, and its E2B record with an access token (and a
// traffic token when private).
func (f *fixture) sandbox(env map[string]string, private bool) store.E2BSandbox {
	return f.sandboxOf("", env, private)
}

// sandboxOf is sandbox of the custom template templateID.
func (f *fixture) sandboxOf(templateID string, env map[string]string, private bool) store.E2BSandbox {
	f.t.Helper()
	now := time.Now()
	sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: f.account, NodeID: "n1", Status: store.SandboxRunning, Runtime: "fake", CreatedAt: now, Deadline: now.Add(5 * time.Minute),
		TemplateID: templateID}
	if err := f.st.CreateSandbox(f.t.Context(), &sb); err != nil {
		f.t.Fatal(err)
	}
	e := store.E2BSandbox{SandboxID: sb.ID, AccountID: f.account, TemplateID: "base", EnvVars: env, AccessToken: token(f.t), CreatedAt: now}
	if private {
		e.TrafficToken = token(f.t)
	}
	if err := f.st.CreateE2BSandbox(f.t.Context(), e); err != nil {
		f.t.Fatal(err)
	}
	return e
}

// start starts cfg through the proxy's process service with headers and
// answers its stdout, to its end.
func (f *fixture) start(t *testing.T, headers map[string]string, cfg *pb.ProcessConfig) string {
	t.Helper()
	client := processconnect.NewProcessClient(http.DefaultClient, f.srv.URL, connect.WithProtoJSON())
	req := connect.NewRequest(&pb.StartRequest{Process: cfg})
	for k, v := range headers {
		req.Header().Set(k, v)
	}
	stream, err := client.Start(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for stream.Receive() {
		out += string(stream.Msg().GetEvent().GetData().GetStdout())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// call serves a request and decodes a JSON answer into out (when not
// nil).
func (f *fixture) call(method, path string, headers map[string]string, out any) int {
	f.t.Helper()
	r := httptest.NewRequest(method, path, nil)
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.srv.Config.Handler.ServeHTTP(w, r)
	if out != nil && w.Body.Len() > 0 {
		if err := json.Unmarshal(w.Body.Bytes(), out); err != nil {
			f.t.Fatalf("%s %s: %d %s: %v", method, path, w.Code, w.Body, err)
		}
	}
	return w.Code
}

// sign makes a file link's signature as the SDKs do.
func sign(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += fmt.Sprintf(":%d", exp)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

func basic(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

func TestAgentRoutes(t *testing.T) {
	f := newFixture(t, nil)
	e := f.sandbox(map[string]string{"FOO": "bar", "X": "1"}, false)
	id := E2BID(e.SandboxID)
	to := func(token string) map[string]string {
		return map[string]string{headerSandboxID: id, headerAccessToken: token, "Authorization": basic("user")}
	}
	var got map[string]string
	if code := f.call("GET", "/files?path=a.txt", to(e.AccessToken), &got); code != 200 {
		t.Fatalf("files with the token: %d", code)
	}
	if got["user"] != "user" || got["token"] != "" || got["authz"] != "" {
		t.Fatalf("the agent got %v: want the user named, and no credentials", got)
	}
	if code := f.call("GET", "/files?path=a.txt", to("wrong"), nil); code != 401 {
		t.Fatalf("files with a wrong token: %d, want 401", code)
	}
	if code := f.call("GET", "/files?path=a.txt", map[string]string{headerAccessToken: e.AccessToken}, nil); code != 400 {
		t.Fatalf("files without a sandbox id: %d, want 400", code)
	}
	if code := f.call("GET", "/files?path=a.txt", map[string]string{headerSandboxID: "sbx-nope", headerAccessToken: e.AccessToken}, nil); code != 404 {
		t.Fatalf("files of a sandbox that does not exist: %d, want 404", code)
	}
	if code := f.call("GET", "/health", map[string]string{headerSandboxID: id}, nil); code != 204 {
		t.Fatalf("health: %d, want 204", code)
	}
	bad := map[string]string{headerSandboxID: id, headerAccessToken: e.AccessToken, "Authorization": basic("../root")}
	if code := f.call("GET", "/files?path=a", bad, nil); code != 400 {
		t.Fatalf("a bad user name: %d, want 400", code)
	}

	// Signed links name no sandbox and carry no token.
	exp := f.now.Add(time.Minute).Unix()
	link := fmt.Sprintf("/files?path=%s&signature=%s&signature_expiration=%d", "%2Ftmp%2Fx", url.QueryEscape(sign("/tmp/x", "read", "", e.AccessToken, exp)), exp)
	if code := f.call("GET", link, nil, &got); code != 200 || got["path"] != "/tmp/x" {
		t.Fatalf("signed read link: %d %v", code, got)
	}
	if code := f.call("POST", link, nil, nil); code != 401 {
		t.Fatalf("a read link used to write: %d, want 401", code)
	}
	f.now = f.now.Add(2 * time.Minute)
	if code := f.call("GET", link, nil, nil); code != 401 {
		t.Fatalf("an expired link: %d, want 401", code)
	}

	// Start gets the sandbox's environment under the request's own.
	if out, want := f.start(t, to(e.AccessToken), &pb.ProcessConfig{Cmd: "env", Envs: map[string]string{"X": "2"}}), "user=user env=map[FOO:bar X:2]"; out != want {
		t.Fatalf("Start reached the agent as %q, want %q", out, want)
	}

	// A paused sandbox's agent is not woken by its traffic, and a stopped
	// one's is gone: 502, as E2B's proxy answers.
	if ok, err := f.st.BeginPause(t.Context(), e.SandboxID, time.Now()); !ok || err != nil {
		t.Fatalf("pause: %v %v", ok, err)
	}
	if code := f.call("GET", "/health", map[string]string{headerSandboxID: id}, nil); code != 502 {
		t.Fatalf("health of a paused sandbox: %d, want 502", code)
	}
	if _, err := f.st.TransitionSandbox(t.Context(), e.SandboxID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	if code := f.call("GET", "/health", map[string]string{headerSandboxID: id}, nil); code != 502 {
		t.Fatalf("health of a stopped sandbox: %d, want 502", code)
	}
}

// TestTemplateDefaults: in a sandbox of a custom template, a process that
// names no user runs as the template's USER, in its WORKDIR, with its ENV
// under the create's envVars and the request's own; what it names wins.
func TestTemplateDefaults(t *testing.T) {
	f := newFixture(t, nil)
	e := f.sandboxOf("tpl_app", map[string]string{"FOO": "create"}, false)
	h := map[string]string{headerSandboxID: E2BID(e.SandboxID), headerAccessToken: e.AccessToken}
	if got, want := f.start(t, h, &pb.ProcessConfig{Cmd: "env", Envs: map[string]string{"X": "2"}}), "user=app env=map[APP:1 FOO:create X:2] cwd=/srv/app"; got != want {
		t.Errorf("defaults: %q, want %q", got, want)
	}
	h["Authorization"] = basic("root")
	cwd := "/tmp"
	if got, want := f.start(t, h, &pb.ProcessConfig{Cmd: "env", Cwd: &cwd, Envs: map[string]string{"APP": "2"}}), "user=root env=map[APP:2 FOO:create] cwd=/tmp"; got != want {
		t.Errorf("named: %q, want %q", got, want)
	}
	var got map[string]string
	delete(h, "Authorization")
	if code := f.call("GET", "/files?path=a.txt", h, &got); code != 200 || got["user"] != "app" {
		t.Errorf("files as: %d %v", code, got)
	}
}

// TestSignedLinkUser: a signed file link acts as exactly the user it was
// signed for; the request's Authorization cannot replace it.
func TestSignedLinkUser(t *testing.T) {
	securitytest.Attack(t, "e2b", "a file link signed for no username (the template's default user) is sent with Authorization: Basic root: to read /etc/shadow as root",
		"the agent is asked as the signed user (the default user), never as the one the Authorization names")
	f := newFixture(t, nil)
	e := f.sandbox(nil, false)
	exp := f.now.Add(time.Minute).Unix()
	for _, signedFor := range []string{"", "user"} {
		link := fmt.Sprintf("/files?path=%s&signature=%s&signature_expiration=%d", url.QueryEscape("/etc/shadow"), url.QueryEscape(sign("/etc/shadow", "read", signedFor, e.AccessToken, exp)), exp)
		if signedFor != "" {
			link += "&username=" + signedFor
		}
		for _, headers := range []map[string]string{
			{"Authorization": basic("root")},
			{"Authorization": basic("root"), headerSandboxID: E2BID(e.SandboxID)},
		} {
			var got map[string]string
			code := f.call("GET", link, headers, &got)
			if code != 200 || got["user"] != "user" {
				t.Errorf("a link signed for %q with %v: %d, the agent was asked as %q, want the default user", signedFor, headers, code, got["user"])
			}
		}
	}
}

// In a cluster, an agent request for a sandbox another node hosts goes
// there, its token checked and its user resolved here.
func TestAgentCluster(t *testing.T) {
	c := &fakeCluster{remote: map[string]bool{}}
	f := newFixture(t, c)
	e := f.sandbox(nil, false)
	c.remote[e.SandboxID] = true
	agent := map[string]string{headerSandboxID: E2BID(e.SandboxID), headerAccessToken: e.AccessToken, "Authorization": basic("root")}
	if code := f.call("GET", "/files?path=x", agent, nil); code != http.StatusTeapot {
		t.Fatalf("agent request for a sandbox hosted elsewhere: %d, want it forwarded", code)
	}
	if got := c.last(); got.node != "n2" || got.user != "root" || got.path != "/files" || got.keyID != agentForwardKey {
		t.Fatalf("forwarded %+v, want the user resolved here", got)
	}
	agent[headerAccessToken] = "wrong"
	if code := f.call("GET", "/files?path=x", agent, nil); code != 401 || len(c.forwards) != 1 {
		t.Fatalf("a wrong token for a sandbox hosted elsewhere: %d, want 401 here", code)
	}
	// The code port, by host: forwarded with the sandbox and the port
	// named in headers, and the user resolved here.
	r := httptest.NewRequest("GET", "/contexts", nil)
	r.Host = codePort + "-" + E2BID(e.SandboxID) + ".sbx.test"
	w := httptest.NewRecorder()
	f.proxy.HostRouter(http.NotFoundHandler()).ServeHTTP(w, r)
	if got := c.last(); w.Code != http.StatusTeapot || got.node != "n2" || got.path != "/contexts" || got.user != "user" {
		t.Fatalf("the code port of a sandbox hosted elsewhere: %d %+v", w.Code, got)
	}
	if r.Header.Get(headerSandboxID) != E2BID(e.SandboxID) || r.Header.Get(headerSandboxPort) != codePort {
		t.Errorf("forwarded without the sandbox and port named: %v", r.Header)
	}
}

func TestDefaultUserOf(t *testing.T) {
	with, without := t.TempDir(), t.TempDir()
	for dir, passwd := range map[string]string{with: "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n", without: "root:x:0:0::/root:/bin/sh\nusers:x:100:100::/:/bin/sh\n"} {
		if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte(passwd), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for dir, want := range map[string]string{with: "user", without: "root", t.TempDir(): "root"} {
		if got := DefaultUserOf(dir); got != want {
			t.Errorf("DefaultUserOf(%s) = %q, want %q", dir, got, want)
		}
	}
}

// With a domain, PORT-ID.DOMAIN reaches that port of that sandbox: its
// agent for envd's port, the port proxy for any other; a sandbox created
// without public traffic wants its traffic token.
func TestHostRouter(t *testing.T) {
	f := newFixture(t, nil)
	public, private := f.sandbox(nil, false), f.sandbox(nil, true)
	pub, priv := E2BID(public.SandboxID), E2BID(private.SandboxID)
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := f.proxy.HostRouter(next)
	serve := func(host, path string, headers map[string]string) int {
		r := httptest.NewRequest("GET", "http://"+host+path, nil)
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	ports := f.ports
	if code := serve("3000-"+pub+".sbx.test:443", "/app", nil); code != http.StatusAccepted || len(ports.got) != 1 ||
		ports.got[0] != fmt.Sprintf("%s:3000/app host=3000-%s.sbx.test:443 token=%q", public.SandboxID, pub, "") {
		t.Fatalf("a public port: %d %v", code, ports.got)
	}
	if code := serve("3000-"+priv+".sbx.test", "/", nil); code != http.StatusForbidden {
		t.Fatalf("a private port without its token: %d, want 403", code)
	}
	if code := serve("3000-"+priv+".sbx.test", "/", map[string]string{headerTrafficToken: private.TrafficToken}); code != http.StatusAccepted || ports.got[1] != fmt.Sprintf("%s:3000/ host=3000-%s.sbx.test token=%q", private.SandboxID, priv, "") {
		t.Fatalf("a private port with its token: %d %v (the token must not reach the sandbox)", code, ports.got)
	}
	// A sandbox that does not exist, and a port nothing answers on: E2B's
	// edge's bodies, which its SDKs and clients know.
	body := func(host string) (int, string) {
		r := httptest.NewRequest("GET", "http://"+host+"/", nil)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, strings.TrimSpace(w.Body.String())
	}
	if code, b := body("3000-sbx_nope.sbx.test"); code != http.StatusBadGateway || b != `{"sandboxId":"sbx-nope","message":"The sandbox was not found","code":502}` {
		t.Fatalf("a sandbox that does not exist: %d %s", code, b)
	}
	if code, b := body(fmt.Sprintf("%d-%s.sbx.test", closedPort, pub)); code != http.StatusBadGateway || b != fmt.Sprintf(`{"sandboxId":%q,"message":"The sandbox is running but port is not open","port":%d,"code":502}`, pub, closedPort) {
		t.Fatalf("a port nothing answers on: %d %s", code, b)
	}
	if code := serve("49983-"+pub+".sbx.test", "/health", nil); code != http.StatusNoContent {
		t.Fatalf("the agent's port: %d, want its /health", code)
	}
	// Only envd's paths reach the agent: its host-only services do not.
	for _, path := range []string{"/sandboxd.agent.v1.Agent/Freeze", "/sandboxd/unpack?path=/", "/"} {
		if code := serve("49983-"+pub+".sbx.test", path, nil); code != http.StatusNotFound {
			t.Errorf("the agent's port, %s: %d, want 404", path, code)
		}
	}
	if code := serve("49983-"+pub+".sbx.test", "/health", map[string]string{headerSandboxID: priv}); code != http.StatusBadRequest {
		t.Fatalf("the agent's port with another sandbox's id: %d, want 400", code)
	}
	for _, host := range []string{"127.0.0.1:8080", "sbx.test", "x.3000-" + pub + ".sbx.test", "abc-" + pub + ".sbx.test", "3000-" + pub + ".other.test"} {
		if code := serve(host, "/", nil); code != http.StatusTeapot {
			t.Errorf("host %s: %d, want it passed on", host, code)
		}
	}
}

// In a cluster, a port request for a sandbox another node hosts goes there
// with the host the caller used, which that node routes by.
func TestHostRouterCluster(t *testing.T) {
	c := &fakeCluster{remote: map[string]bool{}}
	f := newFixture(t, c)
	e := f.sandbox(nil, false)
	c.remote[e.SandboxID] = true
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	host := "3000-" + E2BID(e.SandboxID) + ".sbx.test"
	w := httptest.NewRecorder()
	f.proxy.HostRouter(next).ServeHTTP(w, httptest.NewRequest("GET", "http://"+host+"/x", nil))
	if got := c.last(); w.Code != http.StatusTeapot || got.node != "n2" || got.host != host {
		t.Fatalf("port request for a sandbox elsewhere: %d %+v, want it forwarded with its host", w.Code, got)
	}
	// On the host node: the forward arrives at the node's own address with
	// the caller's host in the header, on the cluster listener.
	c.remote = nil
	r := httptest.NewRequest("GET", "http://127.0.0.1:9999/x", nil)
	r.Header.Set(headerForwardedHost, host)
	w = httptest.NewRecorder()
	refuse := func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusUnauthorized) }
	edge.ClusterHandler(c, f.proxy.HostRouter(next), nil, refuse).ServeHTTP(w, r)
	if w.Code != http.StatusAccepted || len(f.ports.got) != 1 || !strings.Contains(f.ports.got[0], "host="+host) {
		t.Fatalf("forwarded port request on the host node: %d %v", w.Code, f.ports.got)
	}
	// The header means nothing on the public listener.
	r = httptest.NewRequest("GET", "http://127.0.0.1:9999/x", nil)
	r.Header.Set(headerForwardedHost, host)
	w = httptest.NewRecorder()
	f.proxy.HostRouter(next).ServeHTTP(w, r)
	if w.Code != http.StatusTeapot {
		t.Fatalf("a forwarded-host header on the public listener: %d, want it ignored", w.Code)
	}
}

// Sandbox ids are DNS labels in E2B's API ("sbx-..."); sandboxd's own
// form is taken too.
func TestIDs(t *testing.T) {
	for _, id := range []string{"sbx_abc", "sbx-abc", "other"} {
		if got := E2BID(SandboxID(id)); got != strings.Replace(id, "sbx_", "sbx-", 1) {
			t.Errorf("E2BID(SandboxID(%q)) = %q", id, got)
		}
	}
}

// TestCodePort: E2B's code-interpreter port, by header and by host, goes
// to the sandbox's agent's /code as the template's user, in its directory,
// with its environment and create's envVars; /execute needs the access
// token, a sandbox's ports their traffic token when private, and a sandbox
// that is gone gets E2B's edge answer.
func TestCodePort(t *testing.T) {
	f := newFixture(t, nil)
	e := f.sandboxOf("tpl_app", map[string]string{"FOO": "create", "X": "1"}, false)
	id := E2BID(e.SandboxID)
	byHeader := func(extra map[string]string) map[string]string {
		h := map[string]string{headerSandboxID: id, headerSandboxPort: codePort}
		maps.Copy(h, extra)
		return h
	}
	var got struct {
		Path, Query, User, Dir, Token, Traffic string
		Env                                    []string
	}
	if code := f.call("POST", "/execute?source=ci", byHeader(map[string]string{headerAccessToken: e.AccessToken}), &got); code != 200 {
		t.Fatalf("execute with the token: %d", code)
	}
	if got.Path != "/code/execute" || got.Query != "" || got.User != "app" || got.Dir != "/srv/app" || got.Token != "" ||
		!slices.Equal(got.Env, []string{"APP=1", "FOO=create", "X=1"}) {
		t.Errorf("what reached the agent: %+v", got)
	}
	if code := f.call("POST", "/execute", byHeader(nil), nil); code != 401 {
		t.Errorf("execute without the token: %d", code)
	}
	if code := f.call("POST", "/execute", byHeader(map[string]string{headerAccessToken: "wrong"}), nil); code != 401 {
		t.Errorf("execute with a wrong token: %d", code)
	}
	// The SDK sends no token to the context routes; a wrong one is
	// refused.
	if code := f.call("GET", "/contexts", byHeader(nil), &got); code != 200 || got.Path != "/code/contexts" {
		t.Errorf("contexts: %d %+v", code, got)
	}
	if code := f.call("DELETE", "/contexts/abc", byHeader(map[string]string{headerAccessToken: "wrong"}), nil); code != 401 {
		t.Errorf("contexts with a wrong token: %d", code)
	}
	if code := f.call("GET", "/health", byHeader(nil), &got); code != 200 || got.Path != "/code/health" {
		t.Errorf("health: %d %+v", code, got)
	}
	// By host: 49999-ID.DOMAIN.
	r := httptest.NewRequest("POST", "/contexts/abc/restart", nil)
	r.Host = codePort + "-" + id + ".sbx.test"
	w := httptest.NewRecorder()
	f.proxy.HostRouter(http.NotFoundHandler()).ServeHTTP(w, r)
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"path":"/code/contexts/abc/restart"`) || w.Header().Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("by host: %d %s", w.Code, w.Body)
	}
	// A private sandbox takes only its traffic token, which the agent
	// does not see.
	p := f.sandbox(nil, true)
	pid := E2BID(p.SandboxID)
	if code := f.call("GET", "/contexts", map[string]string{headerSandboxID: pid, headerSandboxPort: codePort}, nil); code != 403 {
		t.Errorf("private without the traffic token: %d", code)
	}
	if code := f.call("GET", "/contexts", map[string]string{headerSandboxID: pid, headerSandboxPort: codePort, headerTrafficToken: p.TrafficToken}, &got); code != 200 || got.Traffic != "" {
		t.Errorf("private with the traffic token: %d %+v", code, got)
	}
	// Gone: E2B's edge answer.
	var gone sandboxGone
	if code := f.call("POST", "/execute", map[string]string{headerSandboxID: "nosuchsandbox", headerSandboxPort: codePort}, &gone); code != 502 || gone.Message != "The sandbox was not found" {
		t.Errorf("a sandbox that is gone: %d %+v", code, gone)
	}
	// A preflight is answered for any origin.
	if code := f.call("OPTIONS", "/execute", nil, nil); code != 204 {
		t.Errorf("preflight: %d", code)
	}
}
