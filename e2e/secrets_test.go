package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// Fake operator secrets: distinctive, so that finding one anywhere in a
// sandbox is unambiguous.
const (
	secretGitHub    = "ghp_FAKEoperatorGITHUBtoken0000000001"
	secretAnthropic = "sk-ant-FAKEoperatorANTHROPICkey000002"
	secretOAuth     = "sk-ant-oat-FAKEoperatorOAUTHtoken0003"
	secretModel     = "sk-FAKEoperatorMODELkey00000000000004"
)

var operatorSecrets = []string{secretGitHub, secretAnthropic, secretOAuth, secretModel}

// fakeUpstreams is a fake at a boundary we do not own: the model providers'
// APIs (Anthropic and an OpenAI-compatible one) and GitHub's REST API. It
// records the credentials it was sent and answers like a provider would;
// GitHub answers 404 to everything (no mirror can be made: the test needs
// only the configured owner).
type fakeUpstreams struct {
	*httptest.Server
	mu   sync.Mutex
	keys []string // x-api-key or Authorization of every model request
}

func newFakeUpstreams(t *testing.T) *fakeUpstreams {
	f := &fakeUpstreams{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasPrefix(r.URL.Path, "/github/") {
			http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
			return
		}
		f.mu.Lock()
		f.keys = append(f.keys, r.Header.Get("X-Api-Key")+r.Header.Get("Authorization"))
		f.mu.Unlock()
		if strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "event: delta\ndata: {\"i\":%d}\n\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(400 * time.Millisecond)
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"msg_fake","content":[{"type":"text","text":"hello from the fake model"}],"usage":{"input_tokens":1,"output_tokens":2}}`)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeUpstreams) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...)
}

// searchScript looks for the patterns (base64 of newline-separated
// secrets in $1, decoded into shell memory only, so that no process's
// command line or environment holds them) in the environment and command
// line of every process, and in every readable file under / outside the
// kernel's pseudo filesystems. It prints one line per hit, then a count of
// what it searched.
const searchScript = `pats=$(printf %s "$1" | base64 -d)
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
  if tr '\0' '\n' < "$f" 2>/dev/null | grep -qF -f /dev/fd/3 3<<EOF
$pats
EOF
  then echo "HIT $f"; fi
done
grep -rlsIF -f /dev/fd/3 --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev / 3<<EOF | sed 's/^/HIT file /'
$pats
EOF
ps -eo args 2>/dev/null | grep -F -f /dev/fd/3 3<<EOF | sed 's/^/HIT ps /'
$pats
EOF
echo "searched $(ls -d /proc/[0-9]* | wc -l) processes, $(find / -xdev -type f 2>/dev/null | wc -l) files"
`

func TestSecretsAbsent(t *testing.T) {
	securitytest.Attack(t, "secrets",
		"a tenant searches its sandboxes (every process's environment and command line, every readable file, the process list) for the operator's GITHUB_TOKEN, ANTHROPIC_API_KEY, CLAUDE_CODE_OAUTH_TOKEN and model key, after prompts, coding-agent runs and setup ran there",
		"none of the operator's credentials is found in any sandbox; agents reach the models through the proxy, which the fake provider shows sending the real key")
	up := newFakeUpstreams(t)
	s := startServer(t, filepath.Join(t.TempDir(), "secrets.db"),
		"--rootfs", agentRootfs(t), "--setup-on-first-use=true",
		"--github-token", secretGitHub, "--github-owner", "acme", "--github-api-url", up.URL+"/github/",
		"--anthropic-api-key", secretAnthropic, "--claude-code-oauth-token", secretOAuth,
		"--anthropic-base-url", up.URL+"/anthropic",
		"--model-base-url", up.URL+"/v1", "--model-api-key", secretModel, "--model", "fake-model")
	alice := s.createAccount("alice", false)
	k := s.createKey(alice.ID)

	// Work of every kind runs in the account's sandboxes first: the setup
	// (on the first create), a prompt (OpenCode, which gets opencode.json),
	// a coding agent (Claude Code).
	first := s.createSandbox(k, map[string]any{"prompt": "hello"})
	if r := s.waitRun(k, first["runId"].(string), 3*time.Minute); r.Status != "COMPLETED" {
		t.Fatalf("prompt run %+v", r)
	}
	agent := s.as(k, "POST", "/api/tasks/coding-agent", map[string]any{"repo_url": s.base + "/git/" + alice.ID + ".git", "prompt": "change something"})
	if agent.Status != 200 {
		t.Fatalf("coding agent: %d %s", agent.Status, agent.Raw)
	}
	if r := s.waitRun(k, agent.Body["runId"].(string), 3*time.Minute); r.Status != "COMPLETED" || !strings.Contains(fmt.Sprint(r.Output["stdout"]), "key set") {
		t.Fatalf("coding agent run %+v", r)
	}
	oc := s.as(k, "GET", "/api/sandboxes/file?path=opencode.json", nil)
	if oc.Status != 200 || !strings.Contains(fmt.Sprint(oc.Body["content"]), "http://sandboxd.internal/model/openai") || !strings.Contains(fmt.Sprint(oc.Body["content"]), "{env:RECOUP_API_KEY}") {
		t.Fatalf("opencode.json: %d %s", oc.Status, oc.Raw)
	}

	pats := base64.StdEncoding.EncodeToString([]byte(strings.Join(operatorSecrets, "\n")))
	// Searched from a run and from an exec: both get the sandbox's
	// environment, and the sandbox starts from the snapshot the earlier
	// work left.
	search := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", searchScript, "search", pats}})
	r := s.waitRun(k, search["runId"].(string), 5*time.Minute)
	out := fmt.Sprint(r.Output["stdout"])
	if r.Status != "COMPLETED" || !strings.Contains(out, "searched ") || strings.Contains(out, "HIT") {
		t.Fatalf("search run %s: %s\nstderr: %s", r.Status, out, r.Output["stderr"])
	}
	t.Logf("run: %s", strings.TrimSpace(out))
	id := search["sandboxId"].(string)
	ex := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", searchScript, "search", pats}})
	if ex.Status != 200 || !strings.Contains(fmt.Sprint(ex.Body["stdout"]), "searched ") || strings.Contains(fmt.Sprint(ex.Body["stdout"]), "HIT") {
		t.Fatalf("search exec: %d %s", ex.Status, ex.Raw)
	}

	// The search finds what is there: the sandbox's own key is in every
	// process's environment.
	control := base64.StdEncoding.EncodeToString([]byte(s.sandboxKey(k, id)))
	ex = s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", searchScript, "search", control}})
	if !strings.Contains(fmt.Sprint(ex.Body["stdout"]), "/environ") {
		t.Fatalf("the search does not find the sandbox's own key: %s", ex.Raw)
	}

	// The agents' way to the model: their env points at the proxy with the
	// sandbox's key, and the provider gets the real key from the proxy.
	call := `curl -s -X POST "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" -H 'content-type: application/json' -d '{"model":"m","max_tokens":1,"messages":[]}'; echo
curl -s -X POST http://sandboxd.internal/model/openai/chat/completions -H "Authorization: Bearer $RECOUP_API_KEY" -d '{}'`
	ex = s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", call}})
	if ex.Status != 200 || strings.Count(fmt.Sprint(ex.Body["stdout"]), "hello from the fake model") != 2 {
		t.Fatalf("model through the proxy: %d %s", ex.Status, ex.Raw)
	}
	// Streams pass through as they come: the events arrive spread over the
	// provider's 800 ms, not all at its end. curl's own exit status and
	// error are printed too, so that a broken stream says where it broke.
	stream := `{ curl -sSN -X POST "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" -d '{"stream":true}' 2>&1; echo "curl-exit $?"; } | while read -r line; do [ -n "$line" ] && echo "$(date +%s%3N) $line"; done`
	streamOnce := func() (stamps []int64, curlExit string, raw string) {
		ex := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", stream}})
		for _, line := range strings.Split(strings.TrimSpace(fmt.Sprint(ex.Body["stdout"])), "\n") {
			var ms int64
			if _, err := fmt.Sscan(line, &ms); err != nil {
				continue
			}
			if strings.Contains(line, "event: delta") {
				stamps = append(stamps, ms)
			}
			if _, code, ok := strings.Cut(line, "curl-exit "); ok {
				curlExit = code
			}
		}
		return stamps, curlExit, string(ex.Raw)
	}
	stamps, curlExit, raw := streamOnce()
	if curlExit != "0" {
		// A connection that broke on the way (curl says so) is logged with
		// what the server said about it and tried once more; the stream
		// must then pass through whole. Seen once in CI, under load, and
		// never reproduced alone or under CPU load (see the issue notes).
		t.Logf("the stream broke (curl exit %q): %s\nserver warnings:\n%s", curlExit, raw, serverWarnings(s.logs.String()))
		stamps, curlExit, raw = streamOnce()
	}
	if len(stamps) != 3 || stamps[2]-stamps[0] < 500 || curlExit != "0" {
		t.Fatalf("streamed events at %v (curl exit %q): %s\nserver warnings:\n%s", stamps, curlExit, raw, serverWarnings(s.logs.String()))
	}
	t.Logf("SSE events through the proxy arrived %d ms and %d ms after the first", stamps[1]-stamps[0], stamps[2]-stamps[0])
	seen := up.seen()
	if len(seen) < 3 || seen[len(seen)-3] != secretAnthropic || seen[len(seen)-2] != "Bearer "+secretModel || seen[len(seen)-1] != secretAnthropic {
		t.Fatalf("the provider saw %q", seen)
	}
	for _, sec := range operatorSecrets {
		if strings.Contains(s.logs.String(), sec) {
			t.Fatalf("a secret appears in the server's logs")
		}
	}

	t.Run("GitHub URLs that are not the account's mirror are refused", func(t *testing.T) {
		securitytest.Attack(t, "secrets",
			"a tenant asks the coding agent to work on a GitHub repository of the configured owner that is not its own mirror (where sandboxd's token could push and open pull requests)",
			"the request is refused with 400 and a message naming the only GitHub repository the account may use")
		for _, u := range []string{"https://github.com/acme/private-product", "https://github.com/acme/sandbox-00000000-0000-4000-8000-000000000000"} {
			r := s.as(k, "POST", "/api/tasks/coding-agent", map[string]any{"repo_url": u, "prompt": "push here"})
			if r.Status != 400 || !strings.Contains(fmt.Sprint(r.Body["error"]), "acme/sandbox-"+alice.ID) {
				t.Fatalf("%s: %d %s", u, r.Status, r.Raw)
			}
		}
	})
	s.stopAll(k)
}

// sandboxKey reads a sandbox's RECOUP_API_KEY from outside (with the
// account's key).
func (s *server) sandboxKey(k key, id string) string {
	s.t.Helper()
	r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", `printf %s "$RECOUP_API_KEY"`}})
	key, _ := r.Body["stdout"].(string)
	if r.Status != 200 || !strings.HasPrefix(key, "sbx_") {
		s.t.Fatalf("read sandbox key: %d %s", r.Status, r.Raw)
	}
	return key
}

func TestKeyScope(t *testing.T) {
	securitytest.Attack(t, "keys",
		"code in a sandbox uses its RECOUP_API_KEY against sandboxd.internal to extend its own lifetime, create sandboxes, start runs and coding agents, upload, PATCH or DELETE the environment and stop another sandbox",
		"each is refused with 403 and a message saying the key is a sandbox's; the deadline is unchanged; reads, git push to the account's repository and the model proxy still work")
	s := startServer(t, filepath.Join(t.TempDir(), "scope.db"), "--rootfs", agentRootfs(t))
	alice := s.createAccount("alice", false)
	k := s.createKey(alice.ID)
	sb := s.createSandbox(k, map[string]any{"timeout": 120000})
	other := s.createSandbox(k, map[string]any{})
	id, otherID := sb["sandboxId"].(string), other["sandboxId"].(string)
	_, before := s.sandboxStatus(k, id)

	// Each try: expected status, method, path, body.
	script := `set -u
try() { code=$(curl -s -o /tmp/body -w '%{http_code}' -X "$2" -H "x-api-key: $RECOUP_API_KEY" -H 'content-type: application/json' ${4:+-d "$4"} "http://sandboxd.internal$3"); echo "$1 $code $2 $3 $(head -c 300 /tmp/body)"; }
try 403 POST /api/sandboxes/$SANDBOX_ID/timeout '{"timeout":86400000}'
try 403 POST /api/sandboxes '{}'
try 403 POST /api/sandboxes '{"command":"echo","args":["x"]}'
try 403 POST /api/sandboxes/$SANDBOX_ID/exec '{"command":"echo"}'
try 403 POST /api/tasks/coding-agent '{"repo_url":"http://sandboxd.internal/git/'$RECOUP_ACCOUNT_ID'.git","prompt":"x"}'
try 403 POST /api/sandboxes/files '{"files":[{"url":"http://example.invalid/x","name":"x"}]}'
try 403 PATCH /api/sandboxes '{"snapshotId":"snap_x"}'
try 403 DELETE /api/sandboxes '{}'
try 403 POST /api/sandboxes/$1/stop ''
try 403 POST /api/sandboxes/$SANDBOX_ID/stop ''
try 200 GET /api/sandboxes ''
try 200 GET /api/tasks/runs ''
try 200 GET /api/sandboxes/$SANDBOX_ID/ports ''
cd /workspace && echo scoped > scoped.txt && git add scoped.txt && git commit -qm scoped && git push -q origin HEAD:refs/heads/scoped && echo "pushed ok"
`
	r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script, "scope", otherID}})
	if r.Status != 200 {
		t.Fatalf("exec: %d %s", r.Status, r.Raw)
	}
	out := fmt.Sprint(r.Body["stdout"])
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 14 || lines[13] != "pushed ok" {
		t.Fatalf("script output:\n%s\nstderr: %s", out, r.Body["stderr"])
	}
	for _, line := range lines[:13] {
		f := strings.Fields(line)
		if len(f) < 4 || f[0] != f[1] {
			t.Errorf("want %s, got: %s", f[0], line)
		}
		if f[1] == "403" && !strings.Contains(line, "belongs to a sandbox") {
			t.Errorf("403 without the reason: %s", line)
		}
	}
	status, after := s.sandboxStatus(k, id)
	if status != "running" || after > before {
		t.Fatalf("sandbox %s, timeout %v before, %v after", status, before, after)
	}
	if st, _ := s.sandboxStatus(k, otherID); st != "running" {
		t.Fatalf("the other sandbox is %s", st)
	}
	// The account's own key still has full rights.
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/timeout", map[string]any{"timeout": 60000}); r.Status != 200 {
		t.Fatalf("account key extends: %d %s", r.Status, r.Raw)
	}
	s.stopAll(k)
}

func TestKeyRevoke(t *testing.T) {
	securitytest.Attack(t, "keys",
		"code keeps its sandbox's RECOUP_API_KEY and uses it after the sandbox ended: stopped, timed out, its environment deleted, or found gone after a server crash",
		"the key is revoked on every one of those paths (401)")
	parent := t
	dsn := filepath.Join(t.TempDir(), "revoke.db")
	s := startServer(t, dsn, "--keep-sandboxes=true")
	a := s.createAccount("alice", false)
	k := s.createKey(a.ID)
	valid := func(key string) int {
		return s.call("GET", "/api/sandboxes", map[string]string{"x-api-key": key}, nil).Status
	}
	waitRevoked := func(t *testing.T, what, key string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for valid(key) != 401 {
			if time.Now().After(deadline) {
				t.Fatalf("the key of a sandbox %s still works", what)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("stop", func(t *testing.T) {
		id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
		key := s.sandboxKey(k, id)
		if valid(key) != 200 {
			t.Fatal("a live sandbox's key does not work")
		}
		s.as(k, "POST", "/api/sandboxes/"+id+"/stop", nil)
		waitRevoked(t, "stopped", key)
	})
	t.Run("timeout", func(t *testing.T) {
		id := s.createSandbox(k, map[string]any{"timeout": 3000})["sandboxId"].(string)
		key := s.sandboxKey(k, id)
		waitRevoked(t, "timed out", key)
	})
	t.Run("environment deleted", func(t *testing.T) {
		id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
		key := s.sandboxKey(k, id)
		if r := s.as(k, "DELETE", "/api/sandboxes", map[string]any{}); r.Status != 200 {
			t.Fatalf("delete: %d %s", r.Status, r.Raw)
		}
		waitRevoked(t, "whose environment was deleted", key)
	})
	t.Run("gone after a crash (reconcile)", func(t *testing.T) {
		id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
		key := s.sandboxKey(k, id)
		if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = s.cmd.Wait()
		// The runtime loses the sandbox while the server is down.
		if err := os.Remove(filepath.Join(s.dataDir, "runtime", "gvisor", "ids", id)); err != nil {
			t.Fatal(err)
		}
		s = restartServer(parent, s)
		if st, _ := s.sandboxStatus(k, id); st != "failed" {
			t.Fatalf("vanished sandbox is %s", st)
		}
		waitRevoked(t, "found gone", key)
		// And no key of any ended sandbox is left valid.
		st := storetest.Open(t, dsn)
		defer st.Close()
		keys, err := st.ListAPIKeys(context.Background(), a.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, ak := range keys {
			if ak.SandboxID == "" {
				continue
			}
			sb, err := st.GetSandbox(context.Background(), ak.SandboxID)
			if err == nil && sb.Status != store.SandboxRunning && sb.Status != store.SandboxPending && ak.RevokedAt == nil {
				t.Errorf("key of %s sandbox %s is not revoked", sb.Status, sb.ID)
			}
		}
	})
	s.stopAll(k)
}

// serverWarnings picks the lines of a server log that say what went wrong
// with a request (warnings, errors and the model proxy's request lines), so
// that a failure message carries them in its first lines.
func serverWarnings(logs string) string {
	var keep []string
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, `msg="model request"`) {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
