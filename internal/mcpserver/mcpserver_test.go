package mcpserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/router"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/templates"
	"github.com/sandboxd/sandboxd/internal/volumes"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// noSandboxes is the sandbox service of these tests: none of its methods
// may be reached (each panics), so a test passing through a tool that is
// refused before it asserts that nothing was started or stopped. The
// sandbox tools are tested against real sandboxes in e2e/mcp_test.go.
type noSandboxes struct{ SandboxService }

// fixture is the MCP endpoint mounted in the API server as `sandboxd
// serve` mounts it, on a real SQLite store, real keys and real
// repositories.
type fixture struct {
	st    *store.Store
	url   string
	alice store.Account
	bob   store.Account
	keys  map[string]string // alice, bob, alice-sandbox
	vols  *volumes.Service
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, filepath.Join(t.TempDir(), "mcp.db"))
	f := &fixture{st: st, keys: map[string]string{}}
	f.alice = store.Account{Name: "alice", Kind: store.AccountPersonal}
	f.bob = store.Account{Name: "bob", Kind: store.AccountPersonal}
	for _, a := range []*store.Account{&f.alice, &f.bob} {
		if err := st.CreateAccount(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	sb := store.Sandbox{AccountID: f.alice.ID, NodeID: "n", Status: store.SandboxRunning, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
	if err := st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	for name, k := range map[string]store.APIKey{
		"alice": {AccountID: f.alice.ID}, "bob": {AccountID: f.bob.ID},
		"alice-sandbox": {AccountID: f.alice.ID, SandboxID: sb.ID},
	} {
		plaintext, prefix, hash, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		k.Prefix, k.Hash = prefix, hash
		if err := st.CreateAPIKey(ctx, &k); err != nil {
			t.Fatal(err)
		}
		f.keys[name] = plaintext
	}
	authn := auth.NewAuthenticator(st)
	var handler http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handler.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	repos, err := repo.New(repo.Options{Root: filepath.Join(t.TempDir(), "repos"), LocalURLs: []string{srv.URL}, Access: files.SubmoduleAccess{Auth: authn, Accounts: st}})
	if err != nil {
		t.Fatal(err)
	}
	fileSvc, err := files.New(files.Options{Repos: repos, Fetcher: fetch.New(fetch.Options{}), PublicURL: srv.URL, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	gate, err := edge.NewGate(authn, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The real templates service; its builds are queued, not run (no
	// worker): the tests finish them through the store.
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	tpls, err := templates.New(templates.Config{Store: st, Jobs: jc, NodeID: "here", Dir: filepath.Join(t.TempDir(), "templates")})
	if err != nil {
		t.Fatal(err)
	}
	events, err := webhooks.New(webhooks.Config{Store: st, Key: make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	// The real volumes service: its volumes are rows until a sandbox
	// attaches one, which none here does.
	vols, err := volumes.New(volumes.Config{Store: st, NodeID: "here", Dir: filepath.Join(t.TempDir(), "volumes"), Runtime: "gvisor",
		Limits: volumes.Limits{Count: 5, MaxBytes: 4 * volumes.GiB}})
	if err != nil {
		t.Fatal(err)
	}
	f.vols = vols
	h, err := New(Options{Store: st, Gate: gate, Sandboxes: noSandboxes{}, Files: fileSvc, Templates: tpls, Events: events, Volumes: vols, Version: "test", PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	handler = router.New(router.Options{Routes: []router.Route{{Pattern: Path, Handler: h}}})
	return f
}

// withKey adds the key to every request as Authorization: Bearer.
type withKey struct{ key string }

func (k withKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens an MCP session with the SDK's own client over Streamable
// HTTP.
func (f *fixture) connect(t *testing.T, who string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: f.url + Path, HTTPClient: &http.Client{Transport: withKey{f.keys[who]}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect as %s: %v", who, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callTool calls a tool and returns its text and whether it is an error.
func callTool(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var text []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text = append(text, tc.Text)
		}
	}
	return strings.Join(text, "\n"), res.IsError
}

func TestUnauthenticatedIs401(t *testing.T) {
	f := newFixture(t)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for name, header := range map[string]string{"no key": "", "bad key": "Bearer sbx_notakey", "not bearer": "Basic eDp5"} {
		req, _ := http.NewRequest("POST", f.url+Path, strings.NewReader(init))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if header != "" {
			req.Header.Set("Authorization", header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e contract.ErrorBody
		_ = json.Unmarshal(body, &e)
		if resp.StatusCode != 401 || e.Status != "error" || e.Error == "" || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d %s %v", name, resp.StatusCode, body, resp.Header)
		}
	}
	// The SDK's client sees the refusal at connect.
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	if _, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: f.url + Path, HTTPClient: &http.Client{Transport: withKey{"sbx_wrong"}}, MaxRetries: -1}, nil); err == nil {
		t.Fatal("connected with a wrong key")
	}
}

func TestToolsAndFiles(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, "alice")
	ctx := context.Background()

	var names []string
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	want := []string{"build_template", "create_volume", "delete_snapshot", "delete_template", "delete_volume", "fork_volume", "get_run", "get_template", "list_events", "list_files", "list_snapshots", "list_templates", "list_volumes", "pause_sandbox", "prompt_sandbox", "read_file", "resize_volume", "resume_sandbox", "run_code", "run_command", "snapshot_sandbox", "stop_sandbox", "upload_files", "write_file"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools %v", names)
	}

	if text, isErr := callTool(t, cs, "write_file", map[string]any{"path": "notes/hello world.md", "content": "# Hi\n", "message": "Add notes"}); isErr || !strings.Contains(text, `"path": "notes/hello world.md"`) {
		t.Fatalf("write_file: %v %s", isErr, text)
	}
	if text, isErr := callTool(t, cs, "write_file", map[string]any{"path": "img/dot.bin", "content": "AAEC", "encoding": "base64"}); isErr {
		t.Fatalf("write_file base64: %s", text)
	}
	if text, isErr := callTool(t, cs, "read_file", map[string]any{"path": "notes/hello world.md"}); isErr || text != "# Hi\n" {
		t.Fatalf("read_file: %v %q", isErr, text)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "img/dot.bin"}})
	if err != nil || res.IsError {
		t.Fatalf("read binary: %v %+v", err, res)
	}
	if er, ok := res.Content[0].(*mcp.EmbeddedResource); !ok || string(er.Resource.Blob) != "\x00\x01\x02" {
		t.Fatalf("binary content %#v", res.Content[0])
	}
	text, isErr := callTool(t, cs, "list_files", nil)
	if isErr || !strings.Contains(text, `"path": "notes/hello world.md"`) || !strings.Contains(text, `"path": "img/dot.bin"`) {
		t.Fatalf("list_files: %s", text)
	}
	if text, _ := callTool(t, cs, "list_files", map[string]any{"path": "img"}); strings.Contains(text, "notes/") || !strings.Contains(text, "img/dot.bin") {
		t.Fatalf("list_files under img: %s", text)
	}

	// The repository's files are resources.
	lr, err := cs.ListResources(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var uri string
	for _, r := range lr.Resources {
		if r.Name == "notes/hello world.md" {
			uri = r.URI
		}
	}
	if uri != "sandboxd://files/"+f.alice.ID+"/notes/hello%20world.md" {
		t.Fatalf("resources %+v", lr.Resources)
	}
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "# Hi\n" {
		t.Fatalf("read resource: %v %+v", err, rr)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "sandboxd://files/" + f.alice.ID + "/missing.md"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("missing resource: %v", err)
	}
}

// TestBadInput: bad arguments are tool errors with the API's messages,
// refused before any service is reached.
func TestBadInput(t *testing.T) {
	f := newFixture(t)
	cs := f.connect(t, "alice")
	cases := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"read_file", map[string]any{}, "path is required"},
		{"read_file", map[string]any{"path": "../etc/passwd"}, "path must stay inside the repository"},
		{"read_file", map[string]any{"path": 7}, "Expected string, received number"},
		{"read_file", map[string]any{"path": "x", "account_id": "nope"}, "account_id must be a valid UUID"},
		{"read_file", map[string]any{"path": "missing.md"}, "No GitHub repository found for this account"},
		{"write_file", map[string]any{"path": "a.txt"}, "content is required"},
		{"write_file", map[string]any{"path": "a.txt", "content": "x", "encoding": "rot13"}, `encoding must be "utf-8" or "base64"`},
		{"upload_files", map[string]any{"files": []any{}}, "At least one file is required"},
		{"upload_files", map[string]any{"files": []any{map[string]any{"url": "ftp://x/y", "name": "y"}}}, "Each file must have a valid URL"},
		{"run_command", map[string]any{}, "command cannot be empty"},
		{"run_command", map[string]any{"command": "ls", "prompt": "hi"}, "Cannot specify both command and prompt"},
		{"run_command", map[string]any{"command": "ls", "timeout": -5}, "timeout must be a positive number of milliseconds"},
		{"run_command", map[string]any{"command": "ls", "stdin": "x"}, "stdin needs sandbox_id"},
		{"run_command", map[string]any{"command": "ls", "network": "everywhere"}, `unknown mode "everywhere"`},
		{"run_command", map[string]any{"sandbox_id": "", "command": "ls"}, "sandbox_id is required"},
		{"run_command", map[string]any{"sandbox_id": "sb_x", "command": "ls", "env": map[string]any{"A=B": "c"}}, "env names must be non-empty and contain no '='"},
		{"prompt_sandbox", map[string]any{}, "prompt cannot be empty"},
		{"prompt_sandbox", map[string]any{"prompt": "hi", "wait": "yes"}, "Expected boolean, received string"},
		{"get_run", map[string]any{"limit": 500}, "limit must be an integer between 1 and 100"},
		{"get_run", map[string]any{"run_id": "run_nope"}, "Task run not found"},
		{"stop_sandbox", map[string]any{}, "sandbox_id is required"},
		{"stop_sandbox", map[string]any{"sandbox_id": "sb_nope"}, "Sandbox not found"},
	}
	for _, tc := range cases {
		text, isErr := callTool(t, cs, tc.tool, tc.args)
		if !isErr || !strings.Contains(text, tc.want) {
			t.Errorf("%s %v: error %v %q, want %q", tc.tool, tc.args, isErr, text, tc.want)
		}
	}
}

// TestOtherAccounts: another account's ids are "not found" and another
// account_id is refused, as the API answers them; a sandbox's key keeps
// its read-only scope.
func TestOtherAccounts(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alice, bob := f.connect(t, "alice"), f.connect(t, "bob")
	if _, isErr := callTool(t, alice, "write_file", map[string]any{"path": "secret.md", "content": "alice only\n"}); isErr {
		t.Fatal("alice's write failed")
	}
	run := store.Run{AccountID: f.alice.ID, Task: "run-sandbox-command", Status: store.RunCompleted}
	if err := f.st.CreateRun(ctx, &run); err != nil {
		t.Fatal(err)
	}
	sbs, err := f.st.ListSandboxes(ctx, f.alice.ID)
	if err != nil || len(sbs) != 1 {
		t.Fatal(sbs, err)
	}
	aliceSandbox := sbs[0].ID
	if text, isErr := callTool(t, alice, "get_run", map[string]any{"run_id": run.ID}); isErr || !strings.Contains(text, run.ID) {
		t.Fatalf("alice's own run: %s", text)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"read_file", map[string]any{"path": "secret.md", "account_id": f.alice.ID}, "Access denied to specified account_id"},
		{"list_files", map[string]any{"account_id": f.alice.ID}, "Access denied to specified account_id"},
		{"get_run", map[string]any{"run_id": run.ID}, "Task run not found"},
		{"get_run", map[string]any{"account_id": f.alice.ID}, "Access denied to specified account_id"},
		{"stop_sandbox", map[string]any{"sandbox_id": aliceSandbox}, "Sandbox not found"},
		{"run_command", map[string]any{"sandbox_id": aliceSandbox, "command": "cat", "args": []string{"secret.md"}}, "Sandbox not found"},
		{"run_command", map[string]any{"command": "ls", "account_id": f.alice.ID}, "Access denied to specified account_id"},
		{"write_file", map[string]any{"path": "x.md", "content": "x", "account_id": f.alice.ID}, "Access denied to specified account_id"},
	} {
		text, isErr := callTool(t, bob, tc.tool, tc.args)
		if !isErr || !strings.Contains(text, tc.want) {
			t.Errorf("bob %s %v: %v %q, want %q", tc.tool, tc.args, isErr, text, tc.want)
		}
	}
	// Bob's own files do not include Alice's, and her resources are not
	// his to read.
	callTool(t, bob, "write_file", map[string]any{"path": "bob.md", "content": "bob\n"})
	if text, _ := callTool(t, bob, "read_file", map[string]any{"path": "secret.md"}); text != "File not found in repository" {
		t.Fatalf("bob reads secret.md of his own: %s", text)
	}
	if _, err := bob.ReadResource(ctx, &mcp.ReadResourceParams{URI: "sandboxd://files/" + f.alice.ID + "/secret.md"}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("bob reads alice's resource: %v", err)
	}
	if lr, err := bob.ListResources(ctx, nil); err != nil || len(lr.Resources) != 1 || lr.Resources[0].Name != "bob.md" {
		t.Fatalf("bob's resources: %v %+v", err, lr)
	}

	// A sandbox's key reads; it may not write, start or stop anything.
	sbKey := f.connect(t, "alice-sandbox")
	if text, isErr := callTool(t, sbKey, "read_file", map[string]any{"path": "secret.md"}); isErr || text != "alice only\n" {
		t.Fatalf("sandbox key read: %s", text)
	}
	for _, tool := range []string{"write_file", "upload_files", "run_command", "prompt_sandbox", "stop_sandbox", "pause_sandbox", "resume_sandbox", "build_template", "delete_template",
		"create_volume", "delete_volume", "resize_volume", "fork_volume"} {
		text, isErr := callTool(t, sbKey, tool, map[string]any{"path": "x", "content": "x", "command": "ls", "prompt": "x", "sandbox_id": aliceSandbox, "name": "x", "image": "registry.example/x", "template": "x", "size_mb": 128, "new_name": "y"})
		if !isErr || !strings.Contains(text, "This key belongs to a sandbox") || !strings.Contains(text, "the "+tool+" tool needs an account key") {
			t.Errorf("sandbox key %s: %v %q", tool, isErr, text)
		}
	}
}

// TestConcurrentKeys: requests of different keys at once each act for
// their own key; none sees the other's principal.
func TestConcurrentKeys(t *testing.T) {
	f := newFixture(t)
	alice, bob := f.connect(t, "alice"), f.connect(t, "bob")
	callTool(t, alice, "write_file", map[string]any{"path": "who.txt", "content": "alice"})
	callTool(t, bob, "write_file", map[string]any{"path": "who.txt", "content": "bob"})
	var wg sync.WaitGroup
	for i := range 20 {
		cs, want := alice, "alice"
		if i%2 == 1 {
			cs, want = bob, "bob"
		}
		wg.Go(func() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_file", Arguments: map[string]any{"path": "who.txt"}})
			if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != want {
				t.Errorf("%s read %v %+v", want, err, res)
			}
		})
	}
	wg.Wait()
}
