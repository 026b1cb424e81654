package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// fakeGitHub is a fake at a boundary we do not own: GitHub's REST API (the
// few calls sandboxd makes: get a repository, open a pull request) and its
// git smart-HTTP server, backed by bare repositories under a directory. It
// records the credentials git pushes with and the pull requests opened.
type fakeGitHub struct {
	*httptest.Server
	root string
	mu   sync.Mutex
	auth []string         // passwords git sent
	prs  []map[string]any // bodies of opened pull requests
}

func newFakeGitHub(t *testing.T) *fakeGitHub {
	f := &fakeGitHub{root: t.TempDir()}
	backend := &cgi.Handler{Path: mustLookPath(t, "git"), Args: []string{"http-backend"},
		Env: []string{"GIT_PROJECT_ROOT=" + f.root, "GIT_HTTP_EXPORT_ALL=1", "REMOTE_USER=sandboxd"}}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case strings.HasPrefix(p, "/git/"):
			_, pass, ok := r.BasicAuth()
			if !ok {
				w.Header().Set("WWW-Authenticate", `Basic realm="fake"`)
				http.Error(w, "auth", http.StatusUnauthorized)
				return
			}
			f.mu.Lock()
			f.auth = append(f.auth, pass)
			f.mu.Unlock()
			r2 := r.Clone(r.Context())
			r2.URL.Path = strings.TrimPrefix(p, "/git")
			backend.ServeHTTP(w, r2)
		case strings.HasPrefix(p, "/api/repos/acme/") && strings.HasSuffix(p, "/pulls") && r.Method == "POST":
			var body map[string]any
			_ = json.NewDecoder(r.Body).Decode(&body)
			f.mu.Lock()
			f.prs = append(f.prs, body)
			n := len(f.prs)
			f.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"number":%d,"html_url":"https://github.com/%s/pull/%d"}`, n, strings.TrimSuffix(strings.TrimPrefix(p, "/api/repos/"), "/pulls"), n)
		case strings.HasPrefix(p, "/api/repos/acme/") && r.Method == "GET":
			name := strings.TrimPrefix(p, "/api/repos/acme/")
			bare := filepath.Join(f.root, "acme", name+".git")
			if out, err := exec.Command("git", "init", "-q", "--bare", "-b", "main", bare).CombinedOutput(); err != nil {
				t.Errorf("init fake repository: %v %s", err, out)
			}
			_ = exec.Command("git", "--git-dir="+bare, "config", "http.receivepack", "true").Run()
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"name":%q,"full_name":"acme/%s","private":true,"default_branch":"main","clone_url":"%s/git/acme/%s.git","html_url":"https://github.com/acme/%s"}`,
				name, name, f.URL, name, name)
		default:
			_, _ = io.Copy(io.Discard, r.Body)
			http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func mustLookPath(t *testing.T, name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAgentForge(t *testing.T) {
	securitytest.Attack(t, "secrets",
		"the coding agent works on the account's GitHub mirror: the sandbox would need sandboxd's GitHub token to push there",
		"the sandbox clones and pushes sandboxd's own repository with its sandbox key; the host pushes the branch to GitHub with the token and opens the pull request; the token is only ever sent by the host")
	gh := newFakeGitHub(t)
	s := startServer(t, filepath.Join(t.TempDir(), "forge.db"), "--rootfs", agentRootfs(t),
		"--github-token", secretGitHub, "--github-owner", "acme", "--github-api-url", gh.URL+"/api/",
		"--anthropic-api-key", secretAnthropic)
	a := s.createAccount("alice", false)
	k := s.createKey(a.ID)
	// A first commit on main (the run's work is pushed, then mirrored).
	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", "echo base > base.txt"}})
	if r := s.waitRun(k, sb["runId"].(string), 2*time.Minute); r.Status != "COMPLETED" || r.Output["branch"] != "main" {
		t.Fatalf("first run %+v", r)
	}
	mirror := "https://github.com/acme/sandbox-" + a.ID
	if got := s.as(k, "GET", "/api/sandboxes", nil).Body["github_repo"]; got != mirror {
		t.Fatalf("github_repo %v, want the mirror %s", got, mirror)
	}

	// The host pushes to github_repo with the token: naming a repository
	// that is not the account's own mirror is refused, and the row keeps
	// the mirror.
	for _, other := range []string{"https://github.com/acme/sandbox-someone-else", "https://github.com/acme/private-tool"} {
		if r := s.as(k, "PATCH", "/api/sandboxes", map[string]any{"github_repo": other}); r.Status != 400 || !strings.Contains(string(r.Raw), "own mirror") {
			t.Fatalf("PATCH github_repo %s: %d %s", other, r.Status, r.Raw)
		}
		if r := s.as(k, "POST", "/api/tasks/coding-agent", map[string]any{"repo_url": other, "prompt": "x"}); r.Status != 400 {
			t.Fatalf("coding agent on %s: %d %s", other, r.Status, r.Raw)
		}
	}
	if got := s.as(k, "GET", "/api/sandboxes", nil).Body["github_repo"]; got != mirror {
		t.Fatalf("github_repo %v after refused PATCHes, want %s", got, mirror)
	}

	r := s.as(k, "POST", "/api/tasks/coding-agent", map[string]any{"repo_url": mirror, "prompt": "Add AGENT.md"})
	if r.Status != 200 {
		t.Fatalf("coding agent: %d %s", r.Status, r.Raw)
	}
	runID := r.Body["runId"].(string)
	run := s.waitRun(k, runID, 3*time.Minute)
	branch := "agent/" + runID
	if run.Status != "COMPLETED" || run.Output["branch"] != branch || run.Output["pullRequest"] != mirror+"/pull/1" {
		t.Fatalf("run %+v", run)
	}
	bare := filepath.Join(gh.root, "acme", "sandbox-"+a.ID+".git")
	if out, err := exec.Command("git", "--git-dir="+bare, "show", "refs/heads/"+branch+":AGENT.md").Output(); err != nil || string(out) != "Changed by the agent.\n" {
		t.Fatalf("the agent's branch on the fake GitHub: %q %v", out, err)
	}
	gh.mu.Lock()
	defer gh.mu.Unlock()
	if len(gh.prs) != 1 || gh.prs[0]["head"] != branch || gh.prs[0]["base"] != "main" {
		t.Fatalf("pull requests %v", gh.prs)
	}
	for _, pass := range gh.auth {
		if pass != secretGitHub {
			t.Fatalf("git pushed to GitHub with %q, not the host's token", pass)
		}
	}
	if len(gh.auth) == 0 {
		t.Fatal("nothing was pushed to the fake GitHub")
	}
	s.stopAll(k)
}
