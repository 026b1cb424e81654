package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// Stand-ins for the agent CLIs, installed in a test image derived from the
// minimal one. They are fakes at a process boundary we do not own (the
// model APIs the real CLIs call): they print the arguments they were given
// and, for claude, make a change in the repository as an agent would.
const (
	fakeOpenCode = "#!/bin/sh\n# Test stand-in for opencode: prints each argument in brackets.\nfor a; do printf '[%s]\\n' \"$a\"; done\n"
	fakeClaude   = "#!/bin/sh\n# Test stand-in for Claude Code: prints its arguments, edits the repository.\nfor a; do printf '[%s]\\n' \"$a\"; done\necho \"key ${ANTHROPIC_API_KEY:+set}\"\necho 'Changed by the agent.' >> AGENT.md\n"
	anthropicKey = "test-anthropic-key-do-not-log"
)

// fakeModelFlags configure a model, as a prompt needs: a fake provider
// at an address nothing listens on, which the stand-in opencode never
// calls (it only prints its arguments).
var fakeModelFlags = []string{"--model-base-url", "http://127.0.0.1:9/v1", "--model", "fake-model"}

// agentRootfs is the minimal image plus the stand-ins, hard-linked so the
// copy costs nothing and the cached image is not touched.
func agentRootfs(t *testing.T) string {
	t.Helper()
	imageServerReady(t)
	out, err := exec.Command(binary, "image", "ls", "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var imgs []struct{ Template, Rootfs string }
	if err := json.Unmarshal(out, &imgs); err != nil {
		t.Fatal(err)
	}
	var base string
	for _, img := range imgs {
		if img.Template == "minimal" {
			base = img.Rootfs
		}
	}
	if base == "" {
		t.Fatal("no minimal image")
	}
	dir := filepath.Join(t.TempDir(), "rootfs")
	if out, err := exec.Command("cp", "-al", base, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy image: %v %s", err, out)
	}
	for name, script := range map[string]string{"opencode": fakeOpenCode, "claude": fakeClaude} {
		if err := os.WriteFile(filepath.Join(dir, "usr/local/bin", name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestAgents(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "agents.db"), append(fakeModelFlags,
		"--rootfs", agentRootfs(t), "--setup-on-first-use=true", "--anthropic-api-key", anthropicKey)...)
	org := s.createAccount("Acme Records", true)
	alice := s.createAccount("alice", false)
	bob := s.createAccount("bob", false)
	s.admin(nil, "admin", "org", "add-member", "--org", org.ID, "--account", alice.ID)
	k, bk := s.createKey(alice.ID), s.createKey(bob.ID)

	t.Run("first sandbox sets the account up", func(t *testing.T) {
		s.createSandbox(k, map[string]any{})
		var setup map[string]any
		deadline := time.Now().Add(time.Minute)
		for setup == nil && time.Now().Before(deadline) {
			for _, v := range s.as(k, "GET", "/api/tasks/runs", nil).Body["runs"].([]any) {
				if r := v.(map[string]any); r["taskIdentifier"] == "setup-sandbox" {
					setup = r
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		if setup == nil {
			t.Fatal("no setup-sandbox run")
		}
		r := s.waitRun(k, setup["id"].(string), 3*time.Minute)
		if r.Status != "COMPLETED" {
			t.Fatalf("setup %+v", r)
		}
		readme := s.as(k, "GET", "/api/sandboxes/file?path=README.md", nil).Body["content"]
		if !strings.Contains(fmt.Sprint(readme), "Sandbox ID: "+r.Output["sandboxId"].(string)) || !strings.Contains(fmt.Sprint(readme), "Account ID: "+alice.ID) {
			t.Fatalf("README %q", readme)
		}
		// The organization's repository is a submodule at its latest commit,
		// and the file route reads through it.
		orgFile := s.as(k, "GET", "/api/sandboxes/file?path=orgs/"+org.Slug+"/README.md", nil)
		if orgFile.Status != 200 || !strings.Contains(fmt.Sprint(orgFile.Body["content"]), "Acme Records") {
			t.Fatalf("org README through the submodule: %d %s", orgFile.Status, orgFile.Raw)
		}
		orgKey := s.createKey(org.ID)
		u, _ := url.Parse(s.base + "/git/" + org.ID + ".git")
		u.User = url.UserPassword("x", orgKey.Key)
		head, err := exec.Command("git", "ls-remote", u.String(), "refs/heads/main").Output()
		if err != nil || !strings.HasPrefix(string(head), r.Output["orgs"].(map[string]any)[org.Slug].(string)) {
			t.Fatalf("org main %q vs setup %v (%v)", head, r.Output["orgs"], err)
		}
		if id, _ := s.as(k, "GET", "/api/sandboxes", nil).Body["snapshot_id"].(string); id != r.Output["snapshotId"] {
			t.Fatalf("account snapshot %q, setup took %v", id, r.Output["snapshotId"])
		}
		if status, _ := s.sandboxStatus(k, r.Output["sandboxId"].(string)); status != "stopped" {
			t.Fatalf("setup sandbox is %s", status)
		}
	})

	t.Run("POST /api/sandboxes/setup provisions the account", func(t *testing.T) {
		r := s.as(bk, "POST", "/api/sandboxes/setup", nil)
		if r.Status != 200 || r.Body["status"] != "success" {
			t.Fatalf("setup: %d %s", r.Status, r.Raw)
		}
		run := s.waitRun(bk, r.Body["runId"].(string), 3*time.Minute)
		if run.Status != "COMPLETED" {
			t.Fatalf("setup %+v", run)
		}
		readme := s.as(bk, "GET", "/api/sandboxes/file?path=README.md", nil).Body["content"]
		if !strings.Contains(fmt.Sprint(readme), "Account ID: "+bob.ID) {
			t.Fatalf("README %q", readme)
		}
	})

	t.Run("a prompt that starts with a dash is not an option", func(t *testing.T) {
		securitytest.Attack(t, "agents", "a prompt starting with \"-\" is sent, to be read by opencode as a command-line option",
			"opencode is given \"--\" before it, so the prompt stays the prompt")
		sb := s.createSandbox(k, map[string]any{"prompt": "--version"})
		r := s.waitRun(k, sb["runId"].(string), 2*time.Minute)
		if r.Status != "COMPLETED" || r.Output["stdout"] != "[run]\n[--]\n[--version]\n" {
			t.Fatalf("run %+v", r)
		}
	})

	t.Run("prompt reaches opencode as one unchanged argument", func(t *testing.T) {
		prompt := `say "hi" and 'bye'; $(rm -rf /) ` + "`id`" + ` && echo $HOME`
		sb := s.createSandbox(k, map[string]any{"prompt": prompt})
		r := s.waitRun(k, sb["runId"].(string), 2*time.Minute)
		if r.Status != "COMPLETED" || r.Output["stdout"] != "[run]\n["+prompt+"]\n" {
			t.Fatalf("run %+v", r)
		}
	})

	t.Run("sandbox key works for its own account until the sandbox stops", func(t *testing.T) {
		sb := s.createSandbox(k, map[string]any{})
		id := sb["sandboxId"].(string)
		exec := func(script string) string {
			r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
			if r.Status != 200 {
				t.Fatalf("exec: %d %s", r.Status, r.Raw)
			}
			return fmt.Sprint(r.Body["stdout"])
		}
		own := exec(`curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $RECOUP_API_KEY" http://sandboxd.internal/api/sandboxes`)
		foreign := exec(`curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $RECOUP_API_KEY" "http://sandboxd.internal/api/sandboxes?account_id=` + org.ID + `"`)
		if own != "200" || foreign != "403" {
			t.Fatalf("own account %s, organization %s", own, foreign)
		}
		key := strings.TrimSpace(exec(`echo "$RECOUP_API_KEY"`))
		if !strings.HasPrefix(key, "sbx_") || key == k.Key {
			t.Fatalf("sandbox key %q", key)
		}
		s.as(k, "POST", "/api/sandboxes/"+id+"/stop", nil)
		if r := s.call("GET", "/api/sandboxes", map[string]string{"x-api-key": key}, nil); r.Status != 401 {
			t.Fatalf("key of a stopped sandbox: %d", r.Status)
		}
	})

	t.Run("coding agent pushes its change to a branch", func(t *testing.T) {
		repoURL := s.base + "/git/" + alice.ID + ".git"
		r := s.as(k, "POST", "/api/tasks/coding-agent", map[string]any{"repo_url": repoURL, "prompt": "Add AGENT.md\nplease"})
		if r.Status != 200 {
			t.Fatalf("coding-agent: %d %s", r.Status, r.Raw)
		}
		runID := r.Body["runId"].(string)
		if r := s.as(bk, "GET", "/api/tasks/runs?runId="+runID, nil); r.Status != 404 {
			t.Fatalf("another account sees the run: %d", r.Status)
		}
		run := s.waitRun(k, runID, 3*time.Minute)
		branch := "agent/" + runID
		if run.Status != "COMPLETED" || run.Output["branch"] != branch || !strings.Contains(fmt.Sprint(run.Output["diffStat"]), "AGENT.md") {
			t.Fatalf("run %+v", run)
		}
		for _, want := range []string{"[--model]\n[opus]\n", "[--permission-mode]\n[acceptEdits]\n", "[-p]\n[--]\n[Add AGENT.md\nplease]\n", "key set\n"} {
			if !strings.Contains(fmt.Sprint(run.Output["stdout"]), want) {
				t.Fatalf("claude was not run with %q:\n%s", want, run.Output["stdout"])
			}
		}
		dir := filepath.Join(t.TempDir(), "clone")
		u, _ := url.Parse(repoURL)
		u.User = url.UserPassword("x", k.Key)
		if out, err := exec.Command("git", "clone", "-q", "-b", branch, u.String(), dir).CombinedOutput(); err != nil {
			t.Fatalf("clone %s: %v %s", branch, err, out)
		}
		if data, err := os.ReadFile(filepath.Join(dir, "AGENT.md")); err != nil || string(data) != "Changed by the agent.\n" {
			t.Fatalf("AGENT.md %q %v", data, err)
		}
	})

	// Secrets never reach the logs.
	if strings.Contains(s.logs.String(), anthropicKey) {
		t.Fatal("the Anthropic key appears in the server's logs")
	}
}

// TestFullImageCLIs checks that the agent CLIs of the full image run inside
// a sandbox, and that a prompt runs the real `opencode run` to its end
// against a model: a fake OpenAI-compatible provider (fakeChatProvider),
// reached through the model proxy. The server is started with no image
// flag at all, as `make run` starts it, so this also checks that full is
// serve's default. Building the full image takes a few minutes and needs
// the npm registry, so it runs with SANDBOXD_TEST_IMAGES_FULL=1 (make test
// builds the image and sets it).
func TestFullImageCLIs(t *testing.T) {
	if os.Getenv("SANDBOXD_TEST_IMAGES_FULL") != "1" {
		t.Skip("set SANDBOXD_TEST_IMAGES_FULL=1 to build the full image and run its CLIs")
	}
	provider := fakeChatProvider(t)
	s := startServer(t, filepath.Join(t.TempDir(), "full.db"), defaultImage,
		"--model-base-url", provider.URL+"/v1", "--model-api-key", "fake-key", "--model", "fake-model")
	t.Run("a prompt runs opencode to its end, its output plain text", func(t *testing.T) {
		a := s.createAccount("prompter", false)
		k := s.createKey(a.ID)
		sb := s.createSandbox(k, map[string]any{"prompt": "say hi", "timeout": 240000})
		r := s.waitRun(k, sb["runId"].(string), 5*time.Minute)
		all := fmt.Sprint(r.Output["stdout"], r.Output["stderr"])
		t.Logf("opencode's output: %q", all)
		if r.Status != "COMPLETED" || r.Output["exitCode"] != 0.0 || !strings.Contains(all, fakeChatAnswer) {
			t.Fatalf("prompt run %+v, want COMPLETED with the fake model's answer", r)
		}
		if strings.Contains(all, "\x1b") {
			t.Fatalf("terminal escapes in the stored output: %q", all)
		}
	})
	a := s.createAccount("full", false)
	k := s.createKey(a.ID)
	id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	for _, cli := range []string{"opencode", "claude", "openclaw"} {
		r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": cli, "args": []string{"--version"}})
		if r.Status != 200 || r.Body["exitCode"] != 0.0 || strings.TrimSpace(fmt.Sprint(r.Body["stdout"])) == "" {
			t.Fatalf("%s --version: %d %s", cli, r.Status, r.Raw)
		}
		t.Logf("%s --version: %s", cli, strings.TrimSpace(fmt.Sprint(r.Body["stdout"])))
	}
}

// fakeChatAnswer is what fakeChatProvider's model says.
const fakeChatAnswer = "Hi from the fake model."

// fakeChatProvider is a fake OpenAI-compatible model provider: every chat
// completion, streamed or not, answers fakeChatAnswer; a model list names
// fake-model; anything else is 404. It stands in for the model API that
// real agent CLIs call, a process boundary we do not own.
func fakeChatProvider(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.HasSuffix(r.URL.Path, "/models"):
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"}]}`)
		case strings.HasSuffix(r.URL.Path, "/chat/completions") && strings.Contains(string(body), `"stream":true`):
			w.Header().Set("Content-Type", "text/event-stream")
			chunk := func(delta, finish string) {
				fmt.Fprintf(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fake-model\",\"choices\":[{\"index\":0,\"delta\":%s,\"finish_reason\":%s}]}\n\n", delta, finish)
			}
			chunk(`{"role":"assistant","content":"`+fakeChatAnswer+`"}`, "null")
			chunk(`{}`, `"stop"`)
			fmt.Fprint(w, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"fake-model\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5,\"total_tokens\":8}}\n\n")
			fmt.Fprint(w, "data: [DONE]\n\n")
		case strings.HasSuffix(r.URL.Path, "/chat/completions"):
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`, fakeChatAnswer)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}
