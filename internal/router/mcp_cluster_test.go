package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/cluster"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/mcpserver"
	httprouter "github.com/sandboxd/sandboxd/internal/router"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// noFiles is the file service of the cluster tests, whose tools never
// reach it (each method panics).
type noFiles struct{ mcpserver.FileService }

// node is one node of an in-process cluster as `sandboxd serve` wires it:
// a sandbox manager on a fake runtime, the API with /mcp mounted, and a
// cluster listener serving the API to the other nodes.
type node struct {
	id       string
	rt       *runtimefake.Runtime
	mgr      *sandbox.Manager
	url      string // the API and /mcp, as clients reach them
	listener *httptest.Server
}

func startNode(t *testing.T, st *store.Store, authn *auth.Authenticator, id string) *node {
	t.Helper()
	ctx := context.Background()
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	n := &node{id: id, rt: runtimefake.New()}
	n.mgr = sandbox.NewManager(sandbox.Config{Store: st, Runtime: n.rt, Jobs: jc, NodeID: id, DataDir: t.TempDir()})
	router := cluster.NewRouter(cluster.RouterConfig{Store: st, NodeID: id, Secret: cluster.Secret(strings.Repeat("s", 32)),
		DownAfter: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	gate, err := edge.NewGate(authn, router, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := mcpserver.New(mcpserver.Options{Store: st, Gate: gate, Sandboxes: n.mgr, Files: noFiles{}, PollInterval: 20 * time.Millisecond, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	// The node's API, which the tools' requests for its sandboxes reach.
	srv, err := api.New(api.Options{Store: st, Auth: authn, Gate: gate, Sandboxes: n.mgr, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	rt := httprouter.New(httprouter.Options{Routes: append(srv.Routes(), httprouter.Route{Pattern: mcpserver.Path, Handler: h}), NotFound: http.HandlerFunc(srv.NotFound)})
	public := httptest.NewServer(rt)
	t.Cleanup(public.Close)
	n.url = public.URL
	n.listener = httptest.NewServer(rt.ClusterHandler(router, srv.Refuse))
	t.Cleanup(n.listener.Close)
	if err := st.UpsertNode(ctx, &store.Node{ID: id, Address: strings.TrimPrefix(n.listener.URL, "http://"),
		Capacity: store.NodeCapacity{MaxSandboxes: 10, Runtime: "fake"}}); err != nil {
		t.Fatal(err)
	}
	return n
}

// session is an MCP session with one node, and the progress messages it
// received.
type session struct {
	cs       *mcp.ClientSession
	mu       sync.Mutex
	progress []string
}

func (n *node) connect(t *testing.T, key string) *session {
	t.Helper()
	s := &session{}
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.progress = append(s.progress, req.Params.Message)
		},
	})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: n.url + mcpserver.Path, HTTPClient: &http.Client{Transport: withKey{key}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect to node %s: %v", n.id, err)
	}
	t.Cleanup(func() { cs.Close() })
	s.cs = cs
	return s
}

// answer is a tool's result: whether it is an error and its structured
// content as JSON values.
type answer struct {
	IsError bool
	Data    map[string]any
}

func (s *session) call(t *testing.T, name string, args map[string]any, progressToken string) answer {
	t.Helper()
	params := &mcp.CallToolParams{Name: name, Arguments: args}
	if progressToken != "" {
		params.SetProgressToken(progressToken)
	}
	res, err := s.cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	a := answer{IsError: res.IsError}
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &a.Data)
	return a
}

// without is a's data without the fields that differ from call to call.
func (a answer) without(fields ...string) answer {
	data := map[string]any{}
	for k, v := range a.Data {
		data[k] = v
	}
	for _, f := range fields {
		delete(data, f)
	}
	return answer{IsError: a.IsError, Data: data}
}

func newKey(t *testing.T, st *store.Store, account string) string {
	t.Helper()
	plaintext, prefix, hash, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateAPIKey(context.Background(), &store.APIKey{AccountID: account, Prefix: prefix, Hash: hash}); err != nil {
		t.Fatal(err)
	}
	return plaintext
}

// TestToolsOnAnotherNode: two nodes on one database. Through node a, the
// tools that need the node hosting a sandbox of node b are served by b —
// run_command (its output, exit code, errors and progress), stop_sandbox
// (stopped there at once) — with the answers, errors and account rules
// that b itself gives; a new sandbox goes where placement puts it; and a
// host that does not answer is a 502 that says so.
func TestToolsOnAnotherNode(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	authn := auth.NewAuthenticator(st)
	alice := store.Account{Name: "alice", Kind: store.AccountPersonal}
	bob := store.Account{Name: "bob", Kind: store.AccountPersonal}
	for _, a := range []*store.Account{&alice, &bob} {
		if err := st.CreateAccount(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	aliceKey, bobKey := newKey(t, st, alice.ID), newKey(t, st, bob.ID)
	a, b := startNode(t, st, authn, "a"), startNode(t, st, authn, "b")
	a.rt.SetExec(func(context.Context, *runtimefake.Sandbox, runtime.ExecRequest) (runtime.ExecResult, error) {
		t.Error("a command ran on node a, which hosts no sandbox")
		return runtime.ExecResult{}, nil
	})
	b.rt.SetExec(func(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		switch req.Cmd[0] {
		case "nope":
			return runtime.ExecResult{}, runtime.ErrCommandNotFound
		case "sleep":
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		stdin := ""
		if req.Stdin != nil {
			in, _ := io.ReadAll(req.Stdin)
			stdin = string(in)
		}
		fmt.Fprintf(req.Stdout, "%s ran %q with %q\n", sb.ID(), req.Cmd, stdin)
		fmt.Fprint(req.Stderr, "on b\n")
		return runtime.ExecResult{ExitCode: 3}, nil
	})
	sb, _, err := b.mgr.Create(ctx, alice.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	viaA, onB := a.connect(t, aliceKey), b.connect(t, aliceKey)
	bobViaA, bobOnB := a.connect(t, bobKey), b.connect(t, bobKey)

	// A command: b runs it, and a answers what b answers itself (its
	// exit code 3 makes it a tool error, with its output).
	args := map[string]any{"sandbox_id": sb.ID, "command": "cat", "args": []string{"-"}, "stdin": "in", "env": map[string]string{"X": "1"}}
	got := viaA.call(t, "run_command", args, "")
	want := fmt.Sprintf("%s ran [\"cat\" \"-\"] with \"in\"\n", sb.ID)
	if !got.IsError || got.Data["stdout"] != want || got.Data["stderr"] != "on b\n" || got.Data["exitCode"] != 3.0 {
		t.Fatalf("run_command through node a: %+v", got)
	}
	if onHost := onB.call(t, "run_command", args, ""); !reflect.DeepEqual(got.without("durationMs"), onHost.without("durationMs")) {
		t.Fatalf("run_command through node a: %+v\non node b: %+v", got, onHost)
	}
	// Its errors, and the account rules, are b's too: another account's
	// sandbox is not found, whether or not it names the account.
	for _, c := range []struct {
		name         string
		through, onB *session
		args         map[string]any
		status       float64
		message      string
		toolName     string
	}{
		{"command not found", viaA, onB, map[string]any{"sandbox_id": sb.ID, "command": "nope"}, 400, "command not found: nope", "run_command"},
		{"another account's sandbox", bobViaA, bobOnB, map[string]any{"sandbox_id": sb.ID, "command": "true"}, 404, "Sandbox not found", "run_command"},
		{"another account named", bobViaA, bobOnB, map[string]any{"sandbox_id": sb.ID, "command": "true", "account_id": alice.ID}, 403, "Access denied to specified account_id", "run_command"},
		{"stop another account's", bobViaA, bobOnB, map[string]any{"sandbox_id": sb.ID}, 404, "Sandbox not found", "stop_sandbox"},
	} {
		got := c.through.call(t, c.toolName, c.args, "")
		if !got.IsError || got.Data["statusCode"] != c.status || got.Data["error"] != c.message {
			t.Errorf("%s through node a: %+v", c.name, got)
		}
		if onHost := c.onB.call(t, c.toolName, c.args, ""); !reflect.DeepEqual(got, onHost) {
			t.Errorf("%s through node a: %+v\non node b: %+v", c.name, got, onHost)
		}
	}
	if cur, _ := st.GetSandbox(ctx, sb.ID); cur.Status != store.SandboxRunning {
		t.Fatalf("after another account's stop: %s", cur.Status)
	}

	// A long command reports progress while b runs it.
	if got := viaA.call(t, "run_command", map[string]any{"sandbox_id": sb.ID, "command": "sleep"}, "tok"); !got.IsError || got.Data["exitCode"] != 3.0 {
		t.Fatalf("a long command through node a: %+v", got)
	}
	viaA.mu.Lock()
	progress := append([]string(nil), viaA.progress...)
	viaA.mu.Unlock()
	if len(progress) == 0 || !strings.Contains(progress[0], "sleep is running in "+sb.ID) {
		t.Errorf("progress of a long command through node a: %q", progress)
	}

	// Stop: b stops it at once (here it would only be marked stopping and
	// left to a job on b).
	got = viaA.call(t, "stop_sandbox", map[string]any{"sandbox_id": sb.ID}, "")
	if got.IsError || got.Data["sandbox"].(map[string]any)["sandboxStatus"] != "stopped" {
		t.Fatalf("stop_sandbox through node a: %+v", got)
	}
	if b.rt.Destroys(sb.ID) != 1 {
		t.Errorf("node b destroyed the sandbox %d times, want 1", b.rt.Destroys(sb.ID))
	}

	// A new sandbox goes where placement puts it: with a cordoned, on b.
	if err := st.SetNodeSchedule(ctx, "a", store.NodeCordoned); err != nil {
		t.Fatal(err)
	}
	got = viaA.call(t, "run_command", map[string]any{"command": "true", "wait": false}, "")
	id, _ := got.Data["sandbox"].(map[string]any)["sandboxId"].(string)
	runID, _ := got.Data["run"].(map[string]any)["id"].(string)
	if got.IsError || id == "" || runID == "" {
		t.Fatalf("run_command in a new sandbox through node a: %+v", got)
	}
	if placed, err := st.GetSandbox(ctx, id); err != nil || placed.NodeID != "b" {
		t.Fatalf("the new sandbox is on node %q (%v), want b", placed.NodeID, err)
	}

	// A host that does not answer: 502, saying which node.
	b.listener.Close()
	got = viaA.call(t, "run_command", map[string]any{"sandbox_id": id, "command": "true"}, "")
	if !got.IsError || got.Data["statusCode"] != 502.0 || got.Data["error"] != "the node hosting this (b) did not answer; try again shortly" {
		t.Fatalf("a host that does not answer: %+v", got)
	}
}

// withKey adds the key to every request as Authorization: Bearer.
type withKey struct{ key string }

func (k withKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return http.DefaultTransport.RoundTrip(r)
}
