package e2e

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// gitEnv is a hermetic environment for the git client.
func gitEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	return append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com")
}

// gitRun runs the git CLI in dir with stdin and returns its combined
// output and error.
func gitRun(dir string, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env, cmd.Stdin = dir, gitEnv(), stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

// gitOK is gitRun failing the test on error.
func gitOK(t *testing.T, dir string, stdin io.Reader, args ...string) string {
	t.Helper()
	out, err := gitRun(dir, stdin, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// gitURL is the server's clone URL of account with key as the password.
func (s *server) gitURL(accountID, apiKey string) string {
	u, _ := url.Parse(s.base + "/git/" + accountID + ".git")
	u.User = url.UserPassword("x", apiKey)
	return u.String()
}

// rssKiB is the resident memory of the server process.
func (s *server) rssKiB(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// zeros reads as n zero bytes.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := int64(len(p))
	if k > z.n {
		k = z.n
	}
	clear(p[:k])
	z.n -= k
	return int(k), nil
}

// pushTree writes a commit of tree (made by mk in a scratch repository)
// and pushes it to main of url.
func pushTree(t *testing.T, pushURL string, mk func(dir string) string) {
	t.Helper()
	dir := t.TempDir()
	gitOK(t, dir, nil, "init", "-q")
	tree := mk(dir)
	commit := gitOK(t, dir, nil, "commit-tree", "-m", "attack", tree)
	gitOK(t, dir, nil, "push", "-q", pushURL, commit+":refs/heads/main")
}

func TestRepoLimits(t *testing.T) {
	big := make([]byte, 3<<20)
	_, _ = rand.Read(big)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/small.txt":
			fmt.Fprint(w, "small\n")
		case "/big.bin":
			_, _ = w.Write(big)
		default:
			http.NotFound(w, r)
		}
	}))
	defer origin.Close()
	s := startServer(t, filepath.Join(t.TempDir(), "limits.db"), "--allow-private-downloads", "--account-repo-mib", "2")

	t.Run("128 MiB blob from a small push", func(t *testing.T) {
		securitytest.Attack(t, "git objects",
			"a tenant pushes a 128 MiB file of zeros (git compresses it to about 130 KiB) and reads it with GET /api/sandboxes/file, which used to read it whole, then base64 and JSON it",
			"413 with the API's error body naming the 16 MiB limit and the file's size, decided from the object's header: the server's RSS does not grow by the file's size")
		a := s.createAccount("zeros", false)
		k := s.createKey(a.ID)
		pushTree(t, s.gitURL(a.ID, k.Key), func(dir string) string {
			blob := gitOK(t, dir, &zeros{n: 128 << 20}, "hash-object", "-w", "--stdin")
			small := gitOK(t, dir, strings.NewReader("hello\n"), "hash-object", "-w", "--stdin")
			return gitOK(t, dir, strings.NewReader("100644 blob "+blob+"\tzeros.txt\n100644 blob "+small+"\thello.txt\n"), "mktree")
		})
		// git compresses the zeros: what the push stored is small.
		var stored int64
		_ = filepath.Walk(filepath.Join(s.dataDir, "repos", a.ID+".git"), func(_ string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				stored += fi.Size()
			}
			return nil
		})
		if stored == 0 || stored > 1<<20 {
			t.Fatalf("the repository stores %d bytes", stored)
		}
		t.Logf("the 128 MiB file takes %d bytes in the repository", stored)
		before := s.rssKiB(t)
		for i := 0; i < 3; i++ {
			r := s.as(k, "GET", "/api/sandboxes/file?path=zeros.txt", nil)
			if r.Status != http.StatusRequestEntityTooLarge || r.Body["status"] != "error" ||
				!strings.HasPrefix(fmt.Sprint(r.Body["error"]), "File is larger than 16 MiB (128.0 MiB)") {
				t.Fatalf("read of the 128 MiB file: %d %s", r.Status, r.Raw)
			}
		}
		after := s.rssKiB(t)
		t.Logf("server RSS %d KiB before, %d KiB after three reads of the 128 MiB file", before, after)
		if after-before > 32<<10 {
			t.Fatalf("server RSS grew by %d KiB", after-before)
		}
		if r := s.as(k, "GET", "/api/sandboxes/file?path=hello.txt", nil); r.Status != 200 || r.Body["content"] != "hello\n" {
			t.Fatalf("read of a small file: %d %s", r.Status, r.Raw)
		}
		// The listing still shows the file with its size.
		r := s.as(k, "GET", "/api/sandboxes", nil)
		if r.Status != 200 || !strings.Contains(string(r.Raw), `"size":134217728`) || strings.Contains(string(r.Raw), "filetree_truncated") {
			t.Fatalf("list: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("tree bomb", func(t *testing.T) {
		securitytest.Attack(t, "git objects",
			"a tenant pushes a tree bomb: 7 objects (under 1 KiB of pack) whose trees name one subtree 16 times, 6 levels deep — 16,777,216 files — and lists its environment with GET /api/sandboxes",
			"the answer comes at once with the first 10,000 entries and filetree_truncated: true; the rest of the published shape is unchanged")
		a := s.createAccount("bomb", false)
		k := s.createKey(a.ID)
		pushTree(t, s.gitURL(a.ID, k.Key), func(dir string) string {
			tree := gitOK(t, dir, strings.NewReader("x"), "hash-object", "-w", "--stdin")
			for level := 0; level < 6; level++ {
				var b strings.Builder
				for i := 0; i < 16; i++ {
					if level == 0 {
						fmt.Fprintf(&b, "100644 blob %s\tf%02d\n", tree, i)
					} else {
						fmt.Fprintf(&b, "040000 tree %s\td%02d\n", tree, i)
					}
				}
				tree = gitOK(t, dir, strings.NewReader(b.String()), "mktree")
			}
			return tree
		})
		start := time.Now()
		r := s.as(k, "GET", "/api/sandboxes", nil)
		took := time.Since(start)
		tree, _ := r.Body["filetree"].([]any)
		if r.Status != 200 || len(tree) != 10_000 || r.Body["filetree_truncated"] != true {
			t.Fatalf("list: %d, %d entries, truncated %v", r.Status, len(tree), r.Body["filetree_truncated"])
		}
		for _, field := range []string{"status", "sandboxes", "snapshot_id", "github_repo"} {
			if _, ok := r.Body[field]; !ok {
				t.Fatalf("list lost %q: %s", field, r.Raw[:200])
			}
		}
		t.Logf("tree bomb listed in %v (%d bytes of answer)", took, len(r.Raw))
		if took > 5*time.Second {
			t.Fatalf("listing took %v", took)
		}
	})

	t.Run("push over the repository quota", func(t *testing.T) {
		securitytest.Attack(t, "git objects",
			"a tenant pushes incompressible data past its account's repository quota (--account-repo-mib 2) with the git CLI",
			"the push that would pass the quota is refused with a message to the client naming the quota; main does not move and the repository does not grow")
		a := s.createAccount("pusher", false)
		k := s.createKey(a.ID)
		wt := filepath.Join(t.TempDir(), "wt")
		gitOK(t, "", nil, "clone", "-q", s.gitURL(a.ID, k.Key), wt)
		push := func(name string) (string, error) {
			data := make([]byte, 1200<<10)
			_, _ = rand.Read(data)
			if err := os.WriteFile(filepath.Join(wt, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
			gitOK(t, wt, nil, "add", name)
			gitOK(t, wt, nil, "commit", "-q", "-m", name)
			return gitRun(wt, nil, "push", "origin", "HEAD:main")
		}
		if out, err := push("one.bin"); err != nil {
			t.Fatalf("push within the quota: %v\n%s", err, out)
		}
		head := gitOK(t, "", nil, "ls-remote", s.gitURL(a.ID, k.Key), "refs/heads/main")
		out, err := push("two.bin")
		if err == nil || !strings.Contains(out, "sandboxd: push refused") || !strings.Contains(out, "quota of 2 MiB") {
			t.Fatalf("push past the quota: %v\n%s", err, out)
		}
		t.Logf("the client sees:\n%s", out)
		if now := gitOK(t, "", nil, "ls-remote", s.gitURL(a.ID, k.Key), "refs/heads/main"); now != head {
			t.Fatalf("main moved: %s → %s", head, now)
		}
		if r := s.as(k, "GET", "/api/sandboxes/file?path=two.bin", nil); r.Status != 404 {
			t.Fatalf("refused file readable: %d", r.Status)
		}
	})

	t.Run("upload over the repository quota", func(t *testing.T) {
		securitytest.Attack(t, "storage quotas",
			"a tenant uploads files (from a URL, and as multipart) that would take its repository past the account's quota (--account-repo-mib 2)",
			"429 with the API's error body naming the quota, before anything is committed")
		a := s.createAccount("uploader", false)
		k := s.createKey(a.ID)
		up := func(name string) response {
			return s.as(k, "POST", "/api/sandboxes/files", map[string]any{"files": []any{map[string]any{"url": origin.URL + "/" + name, "name": name}}})
		}
		if r := up("small.txt"); r.Status != 200 {
			t.Fatalf("small upload: %d %s", r.Status, r.Raw)
		}
		headOf := func() string { return gitOK(t, "", nil, "ls-remote", s.gitURL(a.ID, k.Key), "refs/heads/main") }
		head := headOf()
		r := up("big.bin")
		if r.Status != http.StatusTooManyRequests || r.Body["status"] != "error" || !strings.Contains(fmt.Sprint(r.Body["error"]), "storage quota of 2 MiB") {
			t.Fatalf("upload past the quota: %d %s", r.Status, r.Raw)
		}
		// Multipart too.
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		fw, _ := mw.CreateFormFile("file", "big.bin")
		_, _ = fw.Write(big)
		mw.Close()
		req, _ := http.NewRequest("POST", s.base+"/api/sandboxes/files", &body)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		req.Header.Set("x-api-key", k.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(raw), "storage quota of 2 MiB") {
			t.Fatalf("multipart upload past the quota: %d %s", resp.StatusCode, raw)
		}
		if headOf() != head {
			t.Fatal("main moved")
		}
		// What fits still uploads.
		if r := up("small.txt"); r.Status != 200 || headOf() == head {
			t.Fatalf("small upload after the refusal: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("organization members may not write its repository", func(t *testing.T) {
		securitytest.Attack(t, "accounts",
			"an organization's member uploads with POST /api/sandboxes/files into orgs/<slug>/ of its workspace, the organization's repository (as a submodule), which git push refuses it",
			"403 with a message saying members may read but not write it; the organization's main does not move; the member still reads it, and the organization's own key still uploads")
		org := s.createAccount("acme-limits", true)
		member := s.createAccount("member", false)
		s.admin(nil, "admin", "org", "add-member", "--org", org.ID, "--account", member.ID)
		orgKey, memberKey := s.createKey(org.ID), s.createKey(member.ID)
		up := func(k key, path string) response {
			return s.as(k, "POST", "/api/sandboxes/files", map[string]any{"path": path, "files": []any{map[string]any{"url": origin.URL + "/small.txt", "name": "small.txt"}}})
		}
		if r := up(orgKey, "docs"); r.Status != 200 {
			t.Fatalf("the organization uploads into its repository: %d %s", r.Status, r.Raw)
		}
		orgHead := func() string {
			return strings.Fields(gitOK(t, "", nil, "ls-remote", s.gitURL(org.ID, orgKey.Key), "refs/heads/main"))[0]
		}
		head := orgHead()
		// The member's workspace has the organization as a submodule at
		// orgs/<slug>, as setup-sandbox makes it.
		pushTree(t, s.gitURL(member.ID, memberKey.Key), func(dir string) string {
			mods := fmt.Sprintf("[submodule \"orgs/%s\"]\n\tpath = orgs/%s\n\turl = ../%s.git\n", org.Slug, org.Slug, org.ID)
			blob := gitOK(t, dir, strings.NewReader(mods), "hash-object", "-w", "--stdin")
			orgs := gitOK(t, dir, strings.NewReader("160000 commit "+head+"\t"+org.Slug+"\n"), "mktree")
			return gitOK(t, dir, strings.NewReader("100644 blob "+blob+"\t.gitmodules\n040000 tree "+orgs+"\torgs\n"), "mktree")
		})
		if r := s.as(memberKey, "GET", "/api/sandboxes/file?path=orgs/"+org.Slug+"/docs/small.txt", nil); r.Status != 200 || r.Body["content"] != "small\n" {
			t.Fatalf("the member reads the organization's file: %d %s", r.Status, r.Raw)
		}
		for _, path := range []string{"orgs/" + org.Slug, "orgs/" + org.Slug + "/docs"} {
			r := up(memberKey, path)
			if r.Status != http.StatusForbidden || r.Body["status"] != "error" || !strings.Contains(fmt.Sprint(r.Body["error"]), "may read but not write") {
				t.Fatalf("member upload into %s: %d %s", path, r.Status, r.Raw)
			}
		}
		if orgHead() != head {
			t.Fatal("the organization's main moved")
		}
		// git push applies the same rule.
		wt := filepath.Join(t.TempDir(), "org")
		gitOK(t, "", nil, "clone", "-q", s.gitURL(org.ID, memberKey.Key), wt)
		gitOK(t, wt, nil, "commit", "-q", "--allow-empty", "-m", "member")
		if out, err := gitRun(wt, nil, "push", "origin", "HEAD:main"); err == nil {
			t.Fatalf("member push into the organization succeeded:\n%s", out)
		}
		// The member's own files still upload, and the organization's key
		// still writes its repository.
		if r := up(memberKey, "notes"); r.Status != 200 {
			t.Fatalf("member upload into its own repository: %d %s", r.Status, r.Raw)
		}
		if r := up(orgKey, "more"); r.Status != 200 || orgHead() == head {
			t.Fatalf("the organization uploads again: %d %s", r.Status, r.Raw)
		}
	})

	t.Run("repeated git parameters and credentials", func(t *testing.T) {
		securitytest.Attack(t, "git server",
			"a member, who may only fetch its organization's repository, asks the git server for ?service=git-upload-pack&service=git-receive-pack (authorised on the first, executed on the last), and sends two Authorization headers",
			"400 for the repeated parameter and 401 for the repeated credentials, before any access check")
		org := s.createAccount("acme-params", true)
		member := s.createAccount("param-member", false)
		s.admin(nil, "admin", "org", "add-member", "--org", org.ID, "--account", member.ID)
		memberKey, orgKey := s.createKey(member.ID), s.createKey(org.ID)
		get := func(query string, auths ...string) int {
			req, _ := http.NewRequest("GET", s.base+"/git/"+org.ID+".git/info/refs?"+query, nil)
			for _, a := range auths {
				req.Header.Add("Authorization", a)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		bearer := func(k key) string { return "Bearer " + k.Key }
		if got := get("service=git-upload-pack&service=git-receive-pack", bearer(memberKey)); got != http.StatusBadRequest {
			t.Fatalf("repeated service: %d", got)
		}
		if got := get("service=git-receive-pack", bearer(memberKey)); got != http.StatusNotFound {
			t.Fatalf("member asks to push: %d", got)
		}
		if got := get("service=git-upload-pack", bearer(memberKey), bearer(orgKey)); got != http.StatusUnauthorized {
			t.Fatalf("two Authorization headers: %d", got)
		}
		if got := get("service=git-upload-pack", bearer(memberKey)); got != http.StatusOK {
			t.Fatalf("member fetch: %d", got)
		}
	})
}
