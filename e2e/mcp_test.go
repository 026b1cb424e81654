package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// fakePromptOpenCode stands in for opencode (whose model API is a process
// boundary we do not own): it prints its arguments, takes a moment as an
// agent would, and changes the repository.
// The prompt "fail" makes it fail at once, as opencode does without a
// model.
const fakePromptOpenCode = "#!/bin/sh\n# Test stand-in for opencode: prints its arguments, edits the repository.\nfor a; do printf '[%s]\\n' \"$a\"; done\n[ \"$2\" = fail ] && { echo 'no provider' >&2; exit 5; }\nsleep 2\necho 'Written by the prompt.' > PROMPTED.md\n"

// mcpRootfs is agentRootfs with an opencode that edits the repository.
func mcpRootfs(t *testing.T) string {
	t.Helper()
	dir := agentRootfs(t)
	// agentRootfs wrote this file itself (it is not a hard link into the
	// cached image); remove it anyway before writing, so that nothing
	// shared is ever written through.
	bin := filepath.Join(dir, "usr/local/bin/opencode")
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte(fakePromptOpenCode), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// bearer adds an API key to every request as Authorization: Bearer.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpClient is an MCP session of the SDK's own client over Streamable HTTP,
// and the progress notifications it received.
type mcpClient struct {
	cs *mcp.ClientSession
	mu sync.Mutex
	// progress maps progress tokens to the notifications' messages.
	progress map[string][]string
}

func (s *server) mcpConnect(k key) *mcpClient {
	s.t.Helper()
	c := &mcpClient{progress: map[string][]string{}}
	client := mcp.NewClient(&mcp.Implementation{Name: "sandboxd-e2e", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			defer c.mu.Unlock()
			tok := fmt.Sprint(req.Params.ProgressToken)
			c.progress[tok] = append(c.progress[tok], req.Params.Message)
		},
	})
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: s.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{k.Key}}, MaxRetries: -1,
	}, nil)
	if err != nil {
		s.t.Fatalf("connect to /mcp: %v", err)
	}
	s.t.Cleanup(func() { cs.Close() })
	c.cs = cs
	return c
}

// toolAnswer is a tool's result: its text, its structured content and
// whether it is an error.
type toolAnswer struct {
	Text    string
	Data    map[string]any
	IsError bool
}

// call calls a tool; with a progress token, the server reports progress
// under it.
func (c *mcpClient) call(t *testing.T, name string, args map[string]any, token string) toolAnswer {
	t.Helper()
	params := &mcp.CallToolParams{Name: name, Arguments: args}
	if token != "" {
		params.SetProgressToken(token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := c.cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var a toolAnswer
	a.IsError = res.IsError
	for _, content := range res.Content {
		if tc, ok := content.(*mcp.TextContent); ok {
			a.Text += tc.Text
		}
	}
	if res.StructuredContent != nil {
		raw, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(raw, &a.Data)
	}
	return a
}

func (c *mcpClient) progressOf(token string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.progress[token])
}

// dig follows keys through nested JSON objects.
func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	return v
}

func TestMCP(t *testing.T) {
	// upload_files downloads from this loopback server.
	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "downloaded "+r.URL.Path+"\n")
	}))
	t.Cleanup(files.Close)
	s := startServer(t, filepath.Join(t.TempDir(), "mcp.db"), append(fakeModelFlags, "--rootfs", mcpRootfs(t), "--allow-private-downloads")...)
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)
	a := s.mcpConnect(ak)

	t.Run("lists its tools", func(t *testing.T) {
		var names []string
		for tool, err := range a.cs.Tools(context.Background(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			if tool.InputSchema == nil || tool.Description == "" {
				t.Errorf("%s has no schema or description", tool.Name)
			}
			names = append(names, tool.Name)
		}
		slices.Sort(names)
		want := []string{"build_template", "create_volume", "delete_snapshot", "delete_template", "delete_volume", "fork_volume", "get_run", "get_template",
			"list_events", "list_files", "list_snapshots", "list_templates", "list_volumes", "pause_sandbox", "prompt_sandbox", "read_file", "resize_volume",
			"resume_sandbox", "run_code", "run_command", "snapshot_sandbox", "stop_sandbox", "upload_files", "write_file"}
		if !slices.Equal(names, want) {
			t.Fatalf("tools %v, want %v", names, want)
		}
	})

	var commandRun string
	t.Run("run_command runs in a new sandbox and waits with progress", func(t *testing.T) {
		r := a.call(t, "run_command", map[string]any{"command": "sh", "args": []string{"-c", "sleep 1; echo hi; uname -r"}}, "cmd")
		if r.IsError || dig(r.Data, "finished") != true || dig(r.Data, "run", "status") != "COMPLETED" {
			t.Fatalf("run_command: %s", r.Text)
		}
		// gVisor's kernel release, not the host's.
		if out := fmt.Sprint(dig(r.Data, "run", "output", "stdout")); !guestKernelAfter(out, "hi\n") {
			t.Fatalf("stdout %q", out)
		}
		if len(a.progressOf("cmd")) == 0 {
			t.Fatal("no progress notification while the run ran")
		}
		commandRun = fmt.Sprint(dig(r.Data, "run", "id"))
	})

	t.Run("a command that exits non-zero is a tool error; its run is COMPLETED", func(t *testing.T) {
		r := a.call(t, "run_command", map[string]any{"command": "sh", "args": []string{"-c", "echo out; exit 3"}}, "")
		if !r.IsError || !strings.HasPrefix(r.Text, "The run's command exited with code 3") || dig(r.Data, "run", "status") != "COMPLETED" ||
			dig(r.Data, "run", "output", "exitCode") != 3.0 || dig(r.Data, "run", "output", "stdout") != "out\n" {
			t.Fatalf("run_command exiting 3: %+v", r)
		}
		id := fmt.Sprint(dig(r.Data, "run", "id"))
		runs, _ := s.as(ak, "GET", "/api/tasks/runs?runId="+id, nil).Body["runs"].([]any)
		if len(runs) != 1 || dig(runs[0], "status") != "COMPLETED" || dig(runs[0], "output", "exitCode") != 3.0 {
			t.Fatalf("the API shows %v", runs)
		}
	})

	t.Run("prompt_sandbox runs OpenCode and lists the files it changed", func(t *testing.T) {
		r := a.call(t, "prompt_sandbox", map[string]any{"prompt": "write PROMPTED.md"}, "prompt")
		if r.IsError || dig(r.Data, "run", "status") != "COMPLETED" {
			t.Fatalf("prompt_sandbox: %s", r.Text)
		}
		if out := dig(r.Data, "run", "output", "stdout"); out != "[run]\n[write PROMPTED.md]\n" {
			t.Fatalf("opencode was given %q", out)
		}
		if dig(r.Data, "run", "output", "branch") != "main" {
			t.Fatalf("run output %v", dig(r.Data, "run", "output"))
		}
		// opencode.json is sandboxd's: it points OpenCode at the model.
		changed, _ := r.Data["changedFiles"].([]any)
		changed = slices.DeleteFunc(changed, func(c any) bool { return dig(c, "path") == "opencode.json" })
		if len(changed) != 1 || dig(changed[0], "path") != "PROMPTED.md" || dig(changed[0], "change") != "added" {
			t.Fatalf("changed files %v (%s)", changed, r.Note())
		}
		msgs := a.progressOf("prompt")
		if len(msgs) < 2 || !strings.Contains(msgs[len(msgs)-1], "is EXECUTING") {
			t.Fatalf("progress %q", msgs)
		}
		t.Logf("%d progress notifications, the last %q", len(msgs), msgs[len(msgs)-1])

		r = a.call(t, "prompt_sandbox", map[string]any{"prompt": "fail"}, "")
		if !r.IsError || !strings.HasPrefix(r.Text, "The run's command exited with code 5") || dig(r.Data, "run", "status") != "COMPLETED" || dig(r.Data, "run", "output", "stderr") != "no provider\n" {
			t.Fatalf("prompt_sandbox whose opencode fails: %+v", r)
		}
	})

	t.Run("files: write, read, list, resources", func(t *testing.T) {
		if r := a.call(t, "read_file", map[string]any{"path": "PROMPTED.md"}, ""); r.IsError || r.Text != "Written by the prompt.\n" {
			t.Fatalf("read_file: %+v", r)
		}
		if r := a.call(t, "write_file", map[string]any{"path": "docs/plan.md", "content": "# Plan\n", "message": "Add the plan"}, ""); r.IsError {
			t.Fatalf("write_file: %s", r.Text)
		}
		up := a.call(t, "upload_files", map[string]any{"files": []any{map[string]any{"url": files.URL + "/data.csv", "name": "data.csv"}}, "path": "in"}, "")
		if up.IsError || !strings.Contains(up.Text, `"path": "in/data.csv"`) {
			t.Fatalf("upload_files: %s", up.Text)
		}
		if r := a.call(t, "read_file", map[string]any{"path": "in/data.csv"}, ""); r.Text != "downloaded /data.csv\n" {
			t.Fatalf("uploaded file reads %q", r.Text)
		}
		r := a.call(t, "list_files", nil, "")
		if r.IsError || !strings.Contains(r.Text, `"path": "docs/plan.md"`) || !strings.Contains(r.Text, `"path": "PROMPTED.md"`) {
			t.Fatalf("list_files: %s", r.Text)
		}
		// The API sees the same repository.
		if got := s.as(ak, "GET", "/api/sandboxes/file?path=docs/plan.md", nil).Body["content"]; got != "# Plan\n" {
			t.Fatalf("API reads %q", got)
		}
		lr, err := a.cs.ListResources(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		uri := "sandboxd://files/" + alice.ID + "/docs/plan.md"
		if !slices.ContainsFunc(lr.Resources, func(r *mcp.Resource) bool { return r.URI == uri }) {
			t.Fatalf("resources %v", lr.Resources)
		}
		rr, err := a.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
		if err != nil || rr.Contents[0].Text != "# Plan\n" {
			t.Fatalf("read resource: %v %+v", err, rr)
		}
	})

	// An idle sandbox of Alice's, for exec and stop.
	sandboxID := s.createSandbox(ak, map[string]any{})["sandboxId"].(string)

	t.Run("run_command in a running sandbox, get_run", func(t *testing.T) {
		r := a.call(t, "run_command", map[string]any{"sandbox_id": sandboxID, "command": "sh", "args": []string{"-c", "cat; pwd; echo $X"}, "stdin": "in\n", "env": map[string]string{"X": "y"}}, "exec")
		if r.IsError || dig(r.Data, "stdout") != "in\n/workspace\ny\n" || dig(r.Data, "exitCode") != 0.0 {
			t.Fatalf("exec: %s", r.Text)
		}
		r = a.call(t, "run_command", map[string]any{"sandbox_id": sandboxID, "command": "sh", "args": []string{"-c", "echo oops >&2; exit 4"}}, "")
		if !r.IsError || !strings.HasPrefix(r.Text, "The command exited with code 4.") || dig(r.Data, "exitCode") != 4.0 || dig(r.Data, "stderr") != "oops\n" {
			t.Fatalf("exec exiting 4: %+v", r)
		}
		r = a.call(t, "get_run", map[string]any{"run_id": commandRun}, "")
		if r.IsError || !strings.Contains(r.Text, commandRun) || !strings.Contains(r.Text, `"status": "COMPLETED"`) {
			t.Fatalf("get_run: %s", r.Text)
		}
		if r := a.call(t, "get_run", map[string]any{"limit": 5}, ""); r.IsError || !strings.Contains(r.Text, commandRun) {
			t.Fatalf("list runs: %s", r.Text)
		}
		// wait false answers at once; get_run follows the run to its end.
		r = a.call(t, "run_command", map[string]any{"command": "sh", "args": []string{"-c", "sleep 1; echo later"}, "wait": false}, "")
		id, _ := dig(r.Data, "run", "id").(string)
		if r.IsError || id == "" || dig(r.Data, "finished") != false || !strings.Contains(r.Note(), "get_run") {
			t.Fatalf("run_command without waiting: %s", r.Text)
		}
		deadline := time.Now().Add(time.Minute)
		for dig(r.Data, "runs") == nil || dig(r.Data["runs"].([]any)[0], "isCompleted") != true {
			if time.Now().After(deadline) {
				t.Fatalf("the run did not end: %s", r.Text)
			}
			time.Sleep(200 * time.Millisecond)
			r = a.call(t, "get_run", map[string]any{"run_id": id}, "")
		}
		if out := dig(r.Data["runs"].([]any)[0], "output", "stdout"); out != "later\n" {
			t.Fatalf("stdout %q", out)
		}
	})

	t.Run("bad input is a tool error with the API's message", func(t *testing.T) {
		for _, tc := range []struct {
			tool string
			args map[string]any
			want string
		}{
			{"run_command", map[string]any{}, "command cannot be empty"},
			{"run_command", map[string]any{"command": "ls", "timeout": 1.5}, "Expected integer, received float"},
			{"run_command", map[string]any{"command": "ls", "account_id": "not-a-uuid"}, "account_id must be a valid UUID"},
			{"read_file", map[string]any{"path": "../../etc/passwd"}, "path must stay inside the repository"},
			{"read_file", map[string]any{"path": "nope.md"}, "File not found in repository"},
			{"get_run", map[string]any{"run_id": "run_missing"}, "Task run not found"},
			{"stop_sandbox", map[string]any{"sandbox_id": "sb_missing"}, "Sandbox not found"},
		} {
			r := a.call(t, tc.tool, tc.args, "")
			if !r.IsError || !strings.Contains(r.Text, tc.want) {
				t.Errorf("%s %v: %+v, want %q", tc.tool, tc.args, r, tc.want)
			}
		}
	})

	t.Run("a missing or wrong key is 401 before any MCP message", func(t *testing.T) {
		securitytest.Attack(t, "api", "a client calls /mcp (tools/call run_command) with no key, a wrong key, and a key that is not Bearer",
			"every request is 401 with the API's error body before the MCP message is read; the SDK's client cannot connect")
		before := len(s.as(ak, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any))
		call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"id"}}}`
		for name, authz := range map[string]string{"no key": "", "wrong key": "Bearer sbx_" + strings.Repeat("a", 52), "basic": "Basic eDp5"} {
			req, _ := http.NewRequest("POST", s.base+"/mcp", strings.NewReader(call))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if authz != "" {
				req.Header.Set("Authorization", authz)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 401 || !strings.Contains(string(body), `"status":"error"`) {
				t.Errorf("%s: %d %s", name, resp.StatusCode, body)
			}
		}
		client := mcp.NewClient(&mcp.Implementation{Name: "x", Version: "1"}, nil)
		if _, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: s.base + "/mcp", HTTPClient: &http.Client{Transport: bearer{"sbx_wrong"}}, MaxRetries: -1}, nil); err == nil {
			t.Fatal("the SDK's client connected with a wrong key")
		}
		// Nothing was started for anyone.
		if n := len(s.as(ak, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any)); n != before {
			t.Fatalf("alice has %d sandboxes, had %d", n, before)
		}
	})

	t.Run("another account's ids are not found", func(t *testing.T) {
		securitytest.Attack(t, "api", "through /mcp, an account stops, execs in and reads the run of another account's sandbox by id, and names it as account_id to read and write its files",
			"the ids answer \"not found\" as in the API (never revealing they exist), account_id is \"Access denied\"; the sandbox keeps running and the other repository is unchanged")
		b := s.mcpConnect(bk)
		for _, tc := range []struct {
			tool string
			args map[string]any
			want string
		}{
			{"stop_sandbox", map[string]any{"sandbox_id": sandboxID}, "Sandbox not found"},
			{"run_command", map[string]any{"sandbox_id": sandboxID, "command": "cat", "args": []string{"PROMPTED.md"}}, "Sandbox not found"},
			{"get_run", map[string]any{"run_id": commandRun}, "Task run not found"},
			{"read_file", map[string]any{"path": "PROMPTED.md", "account_id": alice.ID}, "Access denied to specified account_id"},
			{"list_files", map[string]any{"account_id": alice.ID}, "Access denied to specified account_id"},
			{"write_file", map[string]any{"path": "PROMPTED.md", "content": "bob was here", "account_id": alice.ID}, "Access denied to specified account_id"},
			{"run_command", map[string]any{"command": "id", "account_id": alice.ID}, "Access denied to specified account_id"},
			{"prompt_sandbox", map[string]any{"prompt": "x", "account_id": alice.ID}, "Access denied to specified account_id"},
		} {
			r := b.call(t, tc.tool, tc.args, "")
			if !r.IsError || r.Text != tc.want {
				t.Errorf("bob %s %v: %+v, want %q", tc.tool, tc.args, r, tc.want)
			}
		}
		if _, err := b.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandboxd://files/" + alice.ID + "/PROMPTED.md"}); err == nil || !strings.Contains(err.Error(), "not found") {
			t.Errorf("bob reads alice's file as a resource: %v", err)
		}
		if status, _ := s.sandboxStatus(ak, sandboxID); status != "running" {
			t.Fatalf("alice's sandbox is %s", status)
		}
		if got := s.as(ak, "GET", "/api/sandboxes/file?path=PROMPTED.md", nil).Body["content"]; got != "Written by the prompt.\n" {
			t.Fatalf("alice's file is %q", got)
		}
	})

	t.Run("a sandbox's own key may only read through /mcp", func(t *testing.T) {
		securitytest.Attack(t, "api", "code in a sandbox calls http://sandboxd.internal/mcp with its RECOUP_API_KEY to start a sandbox, write the repository and stop its own sandbox",
			"the tools that change anything answer 403 (\"This key belongs to a sandbox ...\"), as the API's POST routes do; read_file still works")
		script := `for body in \
'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"id"}}}' \
'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"PWNED.md","content":"x"}}}' \
'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"stop_sandbox","arguments":{"sandbox_id":"` + sandboxID + `"}}}' \
'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"docs/plan.md"}}}'; do
  curl -s -H "Authorization: Bearer $RECOUP_API_KEY" -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' -d "$body" http://sandboxd.internal/mcp; echo
done`
		r := s.as(ak, "POST", "/api/sandboxes/"+sandboxID+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
		out := fmt.Sprint(r.Body["stdout"])
		if r.Status != 200 || strings.Count(out, `"statusCode":403`) != 3 || !strings.Contains(out, `# Plan\n`) {
			t.Fatalf("from inside: %d %s %s", r.Status, out, r.Body["stderr"])
		}
		for _, tool := range []string{"run_command", "write_file", "stop_sandbox"} {
			if !strings.Contains(out, "the "+tool+" tool needs an account key") {
				t.Errorf("%s was not refused: %s", tool, out)
			}
		}
		if status, _ := s.sandboxStatus(ak, sandboxID); status != "running" {
			t.Fatalf("the sandbox is %s", status)
		}
		if r := s.as(ak, "GET", "/api/sandboxes/file?path=PWNED.md", nil); r.Status != 404 {
			t.Fatalf("PWNED.md: %d", r.Status)
		}
	})

	t.Run("a client that hangs up ends its call", func(t *testing.T) {
		securitytest.Attack(t, "api", "a client of an older MCP protocol (2025-06-18) starts a long command through /mcp and hangs up, to leave work running for nobody",
			"the call is bound to its HTTP request: the command is killed when the client goes away")
		call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_command","arguments":{"sandbox_id":"` + sandboxID + `","command":"sh","args":["-c","sleep 3; touch /tmp/late"]}}}`
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", s.base+"/mcp", strings.NewReader(call))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		req.Header.Set("Authorization", "Bearer "+ak.Key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				t.Fatal("the call answered before the client hung up")
			}
		}
		time.Sleep(4 * time.Second)
		r := s.as(ak, "POST", "/api/sandboxes/"+sandboxID+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "test -e /tmp/late && echo ran on || echo killed"}})
		if r.Body["stdout"] != "killed\n" {
			t.Fatalf("after the client left: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("stop_sandbox", func(t *testing.T) {
		r := a.call(t, "stop_sandbox", map[string]any{"sandbox_id": sandboxID}, "")
		if r.IsError || dig(r.Data, "sandbox", "sandboxStatus") != "stopped" {
			t.Fatalf("stop_sandbox: %s", r.Text)
		}
		if status, _ := s.sandboxStatus(ak, sandboxID); status != "stopped" {
			t.Fatalf("the sandbox is %s", status)
		}
	})
}

// Note is the result's note, if any.
func (a toolAnswer) Note() string { return fmt.Sprint(a.Data["note"]) }

// TestMCPPromptNeedsOpenCode: on an image without opencode, prompt_sandbox
// is refused up front with the API's message naming the missing CLI.
func TestMCPPromptNeedsOpenCode(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "mcp-noagent.db"))
	k := s.createKey(s.createAccount("carol", false).ID)
	r := s.mcpConnect(k).call(t, "prompt_sandbox", map[string]any{"prompt": "hi"}, "")
	api := s.as(k, "POST", "/api/sandboxes", map[string]any{"prompt": "hi"})
	if !r.IsError || !strings.Contains(r.Text, "a prompt needs the opencode CLI") || r.Text != api.Body["error"] || dig(r.Data, "statusCode") != 400.0 || api.Status != 400 {
		t.Fatalf("prompt without opencode: %+v; the API answers %d %v", r, api.Status, api.Body)
	}
	if n := len(s.as(k, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any)); n != 0 {
		t.Fatalf("%d sandboxes were started", n)
	}
}
