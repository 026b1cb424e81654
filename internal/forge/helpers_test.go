package forge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// git runs git for a test, failing it on error, and returns trimmed stdout.
func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	if dir != "" {
		args = append([]string{"--git-dir=" + dir}, args...)
	}
	cmd := exec.Command("git", args...)
	cmd.Env = append(baseGitEnv(),
		"GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.com")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// newBare creates an empty bare repository at p.
func newBare(t testing.TB, p string) string {
	t.Helper()
	git(t, "", "init", "-q", "--bare", "-b", "main", p)
	return p
}

// commitOn makes a commit with a file named after msg on branch of the bare
// repository and moves the branch to it; it returns the commit. Its parent
// is the branch's tip, unless parents are given ("" alone: a root commit).
func commitOn(t testing.TB, bare, branch, msg string, parent ...string) string {
	t.Helper()
	blob := hashObject(t, bare, msg+"\n")
	cmd := exec.Command("git", "--git-dir="+bare, "mktree")
	cmd.Stdin = strings.NewReader(fmt.Sprintf("100644 blob %s\t%s.txt\n", blob, strings.ReplaceAll(msg, " ", "-")))
	cmd.Env = baseGitEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("mktree: %v", err)
	}
	args := []string{"commit-tree", strings.TrimSpace(string(out)), "-m", msg}
	switch {
	case len(parent) > 0:
		for _, p := range parent {
			if p != "" {
				args = append(args, "-p", p)
			}
		}
	default:
		if tip := revParse(t, bare, "refs/heads/"+branch); tip != "" {
			args = append(args, "-p", tip)
		}
	}
	c := git(t, bare, args...)
	git(t, bare, "update-ref", "refs/heads/"+branch, c)
	return c
}

func hashObject(t testing.TB, bare, content string) string {
	t.Helper()
	cmd := exec.Command("git", "--git-dir="+bare, "hash-object", "-w", "--stdin")
	cmd.Stdin = strings.NewReader(content)
	cmd.Env = baseGitEnv()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hash-object: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// revParse returns the commit ref names in bare, or "" when there is none.
func revParse(t testing.TB, bare, ref string) string {
	t.Helper()
	cmd := exec.Command("git", "--git-dir="+bare, "rev-parse", "-q", "--verify", ref+"^{commit}")
	cmd.Env = baseGitEnv()
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// assertNoSecret fails when secret occurs in any file under dir.
func assertNoSecret(t testing.TB, dir, secret string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s holds the token", p)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
}

// gitServer is a git smart-HTTP server for tests: git http-backend behind
// Basic auth whose password must be the token, serving the bare
// repositories under root as /<owner>/<name>.git.
type gitServer struct {
	*httptest.Server
	root  string
	token string

	mu       sync.Mutex
	requests int
	users    map[string]bool // user names that authenticated
	denied   int
}

func newGitServer(t testing.TB, token string) *gitServer {
	t.Helper()
	execPath := git(t, "", "--exec-path")
	g := &gitServer{root: t.TempDir(), token: token, users: make(map[string]bool)}
	backend := &cgi.Handler{
		Path: filepath.Join(execPath, "git-http-backend"),
		Env: []string{
			"GIT_PROJECT_ROOT=" + g.root, "GIT_HTTP_EXPORT_ALL=1",
			"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		},
		Stderr: testLogWriter{t},
	}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		g.requests++
		g.mu.Unlock()
		user, pass, ok := r.BasicAuth()
		if !ok || pass != g.token {
			g.mu.Lock()
			g.denied++
			g.mu.Unlock()
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		g.mu.Lock()
		g.users[user] = true
		g.mu.Unlock()
		// CGI needs a length; git sends large bodies chunked.
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r2 := r.Clone(r.Context())
		r2.Body, r2.ContentLength, r2.TransferEncoding = io.NopCloser(bytes.NewReader(body)), int64(len(body)), nil
		r2.Header.Del("Authorization")
		r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
		h := *backend
		// REMOTE_USER lets http-backend accept pushes.
		h.Env = append(append([]string{}, backend.Env...), "REMOTE_USER="+user)
		h.ServeHTTP(w, r2)
	}))
	t.Cleanup(g.Close)
	return g
}

// testLogWriter sends what http-backend says on stderr to the test's log.
type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(b []byte) (int, error) {
	w.t.Logf("git http-backend: %s", bytes.TrimSpace(b))
	return len(b), nil
}

func (g *gitServer) requestCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests
}

// repoPath is where /owner/name.git lives on disk.
func (g *gitServer) repoPath(fullName string) string {
	return filepath.Join(g.root, fullName+".git")
}

// fakeGitHub speaks the parts of GitHub's REST API the package uses, with
// state: accounts, repositories and pull requests.
type fakeGitHub struct {
	*httptest.Server
	t     testing.TB
	token string
	me    string
	// git, when set, hosts the repositories' contents: creating a
	// repository creates a bare repository there, and clone URLs lead to
	// it.
	git *gitServer

	mu       sync.Mutex
	owners   map[string]string // login → "User" | "Organization"
	repos    map[string]fakeRepo
	pulls    map[string][]fakePull
	requests []string // "METHOD /path"
	// hideNext makes the next GET of a repository answer 404 although it
	// exists: a concurrent creation that won the race.
	hideNext bool
}

type fakeRepo struct {
	Name        string `json:"name"`
	FullName    string `json:"full_name"`
	Description string `json:"description"`
	Private     bool   `json:"private"`
}

type fakePull struct {
	Number int
	Head   string // owner:branch
	Base   string
	Title  string
	Body   string
}

func newFakeGitHub(t testing.TB, token, me string, orgs ...string) *fakeGitHub {
	t.Helper()
	f := &fakeGitHub{
		t: t, token: token, me: me,
		owners: map[string]string{me: "User", "someone-else": "User"},
		repos:  make(map[string]fakeRepo),
		pulls:  make(map[string][]fakePull),
	}
	for _, o := range orgs {
		f.owners[o] = "Organization"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /users/{login}", f.getUser)
	mux.HandleFunc("GET /user", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"login": f.me, "type": "User"})
	})
	mux.HandleFunc("GET /repos/{owner}/{name}", f.getRepo)
	mux.HandleFunc("POST /orgs/{org}/repos", f.createRepo)
	mux.HandleFunc("POST /user/repos", f.createRepo)
	mux.HandleFunc("POST /repos/{owner}/{name}/pulls", f.createPull)
	mux.HandleFunc("GET /repos/{owner}/{name}/pulls", f.listPulls)
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+f.token {
			writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "Bad credentials"})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func notFound(w http.ResponseWriter) {
	writeJSON(w, http.StatusNotFound, map[string]any{"message": "Not Found"})
}

// takeRequests returns the requests seen since the last call.
func (f *fakeGitHub) takeRequests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.requests
	f.requests = nil
	return r
}

func (f *fakeGitHub) repoJSON(r fakeRepo) map[string]any {
	clone := "https://github.com/" + r.FullName + ".git"
	if f.git != nil {
		clone = f.git.URL + "/" + r.FullName + ".git"
	}
	owner, _, _ := strings.Cut(r.FullName, "/")
	return map[string]any{
		"name": r.Name, "full_name": r.FullName, "description": r.Description, "private": r.Private,
		"default_branch": "main", "html_url": "https://github.com/" + r.FullName, "clone_url": clone,
		"owner": map[string]any{"login": owner},
	}
}

func (f *fakeGitHub) getUser(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	kind, ok := f.owners[r.PathValue("login")]
	f.mu.Unlock()
	if !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"login": r.PathValue("login"), "type": kind})
}

func (f *fakeGitHub) getRepo(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	repo, ok := f.repos[r.PathValue("owner")+"/"+r.PathValue("name")]
	if f.hideNext {
		ok, f.hideNext = false, false
	}
	f.mu.Unlock()
	if !ok {
		notFound(w)
		return
	}
	writeJSON(w, http.StatusOK, f.repoJSON(repo))
}

func (f *fakeGitHub) createRepo(w http.ResponseWriter, r *http.Request) {
	owner := r.PathValue("org")
	f.mu.Lock()
	defer f.mu.Unlock()
	if owner == "" {
		owner = f.me
	} else if f.owners[owner] != "Organization" {
		notFound(w)
		return
	}
	var req struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Private     bool   `json:"private"`
		AutoInit    bool   `json:"auto_init"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"message": "Problems parsing JSON"})
		return
	}
	full := owner + "/" + req.Name
	if _, ok := f.repos[full]; ok {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
			"message": "Repository creation failed.",
			"errors": []map[string]any{{
				"resource": "Repository", "code": "custom", "field": "name",
				"message": "name already exists on this account",
			}},
		})
		return
	}
	repo := fakeRepo{Name: req.Name, FullName: full, Description: req.Description, Private: req.Private}
	f.repos[full] = repo
	if f.git != nil {
		newBare(f.t, f.git.repoPath(full))
	}
	writeJSON(w, http.StatusCreated, f.repoJSON(repo))
}

// deleteRepo removes a repository, as someone deleting it on the forge.
func (f *fakeGitHub) deleteRepo(fullName string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.repos, fullName)
	if f.git != nil {
		if err := os.RemoveAll(f.git.repoPath(fullName)); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *fakeGitHub) createPull(w http.ResponseWriter, r *http.Request) {
	owner, full := r.PathValue("owner"), r.PathValue("owner")+"/"+r.PathValue("name")
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.repos[full]; !ok {
		notFound(w)
		return
	}
	var req struct{ Title, Head, Base, Body string }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"message": "Problems parsing JSON"})
		return
	}
	head := req.Head
	if !strings.Contains(head, ":") {
		head = owner + ":" + head
	}
	if req.Head == req.Base {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
			"message": "Validation Failed",
			"errors":  []map[string]any{{"resource": "PullRequest", "code": "custom", "message": "No commits between " + req.Base + " and " + req.Head}},
		})
		return
	}
	for _, p := range f.pulls[full] {
		if p.Head == head && p.Base == req.Base {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{
				"message": "Validation Failed",
				"errors":  []map[string]any{{"resource": "PullRequest", "code": "custom", "message": "A pull request already exists for " + head + "."}},
			})
			return
		}
	}
	p := fakePull{Number: len(f.pulls[full]) + 1, Head: head, Base: req.Base, Title: req.Title, Body: req.Body}
	f.pulls[full] = append(f.pulls[full], p)
	writeJSON(w, http.StatusCreated, f.pullJSON(full, p))
}

func (f *fakeGitHub) pullJSON(full string, p fakePull) map[string]any {
	return map[string]any{
		"number": p.Number, "title": p.Title, "body": p.Body, "state": "open",
		"html_url": "https://github.com/" + full + "/pull/" + strconv.Itoa(p.Number),
		"head":     map[string]any{"label": p.Head}, "base": map[string]any{"ref": p.Base},
	}
}

func (f *fakeGitHub) listPulls(w http.ResponseWriter, r *http.Request) {
	full := r.PathValue("owner") + "/" + r.PathValue("name")
	q := r.URL.Query()
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []map[string]any{}
	for _, p := range f.pulls[full] {
		if (q.Get("head") == "" || q.Get("head") == p.Head) && (q.Get("base") == "" || q.Get("base") == p.Base) {
			out = append(out, f.pullJSON(full, p))
		}
	}
	writeJSON(w, http.StatusOK, out)
}
