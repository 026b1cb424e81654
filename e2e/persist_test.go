package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// imageServer starts a server whose sandboxes run the "minimal" Debian
// image (git, curl, ca-certificates), built on first use into the shared
// cache (about a minute, once).
func imageServer(t *testing.T, dsn string, extra ...string) *server {
	t.Helper()
	imageServerReady(t)
	return startServer(t, dsn, append([]string{"--template", "minimal"}, extra...)...)
}

// imageServerReady builds the minimal image once per test process.
func imageServerReady(t *testing.T) {
	t.Helper()
	imageOnce.Do(func() {
		// Build (or find in the cache) before the server starts, so the
		// server's health check does not wait on debootstrap.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, "image", "build", "--template", "minimal")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		if err := cmd.Run(); err != nil {
			imageErr = fmt.Errorf("build the minimal image: %v\n%s", err, lastLines(out.String(), 40))
		}
		t.Logf("minimal image ready after %v", time.Since(start).Round(time.Second))
	})
	if imageErr != nil {
		t.Fatal(imageErr)
	}
}

var (
	imageOnce sync.Once
	imageErr  error
)

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// pngBytes is a 1x1 PNG; pdfBytes a tiny PDF with a NUL byte in it.
var (
	pngBytes, _ = base64.StdEncoding.DecodeString("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")
	pdfBytes    = []byte("%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj<<>>endobj\x00\ntrailer<<>>\n%%EOF\n")
)

// TestPersistence: a run's work reaches the repository, the file routes and
// the next sandbox, through git and through the filesystem snapshot.
func TestPersistence(t *testing.T) {
	s := imageServer(t, filepath.Join(t.TempDir(), "persist.db"))
	a := s.createAccount("writer", false)
	other := s.createAccount("reader", false)
	k, ok := s.createKey(a.ID), s.createKey(other.ID)

	script := fmt.Sprintf(`set -e
printf '# Report\nall good\n' > /workspace/report.md
mkdir -p /workspace/img /home/user/.cache
printf '%%s' '%s' | base64 -d > /workspace/img/dot.png
printf '%%s' '%s' | base64 -d > /workspace/doc.pdf
echo outside > /home/user/.cache/x
rm -f /etc/motd`, base64.StdEncoding.EncodeToString(pngBytes), base64.StdEncoding.EncodeToString(pdfBytes))
	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", script}})
	r := s.waitRun(k, sb["runId"].(string), 3*time.Minute)
	if r.Status != "COMPLETED" || r.Output["exitCode"] != 0.0 || r.Output["snapshotId"] == nil || r.Output["branch"] != "main" {
		t.Fatalf("run %+v", r)
	}
	snapshotID := r.Output["snapshotId"].(string)

	// The account's listing shows the snapshot, the repository and the tree.
	list := s.as(k, "GET", "/api/sandboxes", nil)
	if list.Body["snapshot_id"] != snapshotID {
		t.Fatalf("snapshot_id %v, want %s", list.Body["snapshot_id"], snapshotID)
	}
	repoURL, _ := list.Body["github_repo"].(string)
	if !strings.HasSuffix(repoURL, "/git/"+a.ID+".git") {
		t.Fatalf("github_repo %q", repoURL)
	}
	tree, _ := list.Body["filetree"].([]any)
	found := map[string]map[string]any{}
	for _, e := range tree {
		m := e.(map[string]any)
		found[m["path"].(string)] = m
	}
	if e := found["report.md"]; e == nil || e["type"] != "blob" || e["size"] != float64(len("# Report\nall good\n")) || len(e["sha"].(string)) != 40 {
		t.Fatalf("tree entry for report.md: %v (tree %v)", e, tree)
	}
	if e := found["img"]; e == nil || e["type"] != "tree" {
		t.Fatalf("tree entry for img: %v", e)
	}

	// File reads: text as text, binaries as base64 of the same bytes.
	f := s.as(k, "GET", "/api/sandboxes/file?path=report.md", nil)
	if f.Status != 200 || f.Body["content"] != "# Report\nall good\n" || f.Body["encoding"] != nil {
		t.Fatalf("read report.md: %d %s", f.Status, f.Raw)
	}
	for path, want := range map[string][]byte{"img/dot.png": pngBytes, "doc.pdf": pdfBytes} {
		f := s.as(k, "GET", "/api/sandboxes/file?path="+url.QueryEscape(path), nil)
		got, err := base64.StdEncoding.DecodeString(fmt.Sprint(f.Body["content"]))
		if f.Status != 200 || f.Body["encoding"] != "base64" || err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %s: %d %s", path, f.Status, f.Raw)
		}
	}
	if f := s.as(k, "GET", "/api/sandboxes/file?path=nope.md", nil); f.Status != 404 || f.Body["error"] != "File not found in repository" {
		t.Fatalf("missing file: %d %s", f.Status, f.Raw)
	}
	if f := s.as(ok, "GET", "/api/sandboxes/file?path=report.md", nil); f.Status != 404 {
		t.Fatalf("account without a repository: %d %s", f.Status, f.Raw)
	}

	// A new sandbox starts from the snapshot: the repository file and a
	// file outside the repository are there, the deleted file is not.
	sb2 := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", "cat /workspace/report.md /home/user/.cache/x; test ! -e /etc/motd && echo motd-gone; git -C /workspace log --oneline | wc -l; ls /home/user/.cache; stat -c %s /workspace/report.md"}})
	r = s.waitRun(k, sb2["runId"].(string), 3*time.Minute)
	if r.Status != "COMPLETED" || r.Output["stdout"] != "# Report\nall good\noutside\nmotd-gone\n1\nx\n18\n" {
		t.Fatalf("second run %+v", r)
	}

	// The repository clones over git smart HTTP with the account's key.
	dir := filepath.Join(t.TempDir(), "clone")
	u, _ := url.Parse(repoURL)
	u.User = url.UserPassword("x", k.Key)
	out, err := exec.Command("git", "clone", "-q", u.String(), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "report.md")); err != nil || string(data) != "# Report\nall good\n" {
		t.Fatalf("cloned report.md: %q %v", data, err)
	}
	u.User = url.UserPassword("x", ok.Key)
	if out, err := exec.Command("git", "clone", "-q", u.String(), filepath.Join(t.TempDir(), "no")).CombinedOutput(); err == nil {
		t.Fatalf("another account cloned the repository:\n%s", out)
	}

	// PATCH to another account's or an unknown snapshot is 404.
	if r := s.as(ok, "PATCH", "/api/sandboxes", map[string]any{"snapshotId": snapshotID}); r.Status != 404 {
		t.Fatalf("PATCH foreign snapshot: %d %s", r.Status, r.Raw)
	}

	// DELETE removes it all; GET then shows nulls and the repository is
	// gone from disk.
	current := s.as(k, "GET", "/api/sandboxes", nil).Body["snapshot_id"]
	if current == nil || current == snapshotID {
		t.Fatalf("the second run did not move the account's snapshot: %v", current)
	}
	del := s.as(k, "DELETE", "/api/sandboxes", nil)
	if del.Status != 200 || del.Body["deleted_snapshot"].(map[string]any)["snapshot_id"] != current {
		t.Fatalf("DELETE: %d %s", del.Status, del.Raw)
	}
	list = s.as(k, "GET", "/api/sandboxes", nil)
	if list.Body["snapshot_id"] != nil || list.Body["github_repo"] != nil || list.Body["filetree"] != nil {
		t.Fatalf("after DELETE: %s", list.Raw)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "repos", a.ID+".git")); !os.IsNotExist(err) {
		t.Fatalf("repository still on disk: %v", err)
	}
	if del := s.as(k, "DELETE", "/api/sandboxes", nil); del.Status != 200 || del.Body["deleted_snapshot"] != nil {
		t.Fatalf("second DELETE: %d %s", del.Status, del.Raw)
	}
}

// TestUploads: files from URLs land in one commit; failures are listed;
// private and metadata addresses are refused.
func TestUploads(t *testing.T) {
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/a.txt":
			fmt.Fprint(w, "alpha\n")
		case "/b.png":
			w.Write(pngBytes)
		case "/to-metadata":
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	defer origin.Close()

	t.Run("loopback allowed for the test", func(t *testing.T) {
		s := startServer(t, filepath.Join(t.TempDir(), "up.db"), "--allow-private-downloads")
		a := s.createAccount("uploader", false)
		k := s.createKey(a.ID)
		r := s.as(k, "POST", "/api/sandboxes/files", map[string]any{
			"files":   []any{map[string]any{"url": origin.URL + "/a.txt", "name": "a.txt"}, map[string]any{"url": origin.URL + "/b.png", "name": "b.png"}, map[string]any{"url": origin.URL + "/missing", "name": "c.txt"}},
			"path":    "docs",
			"message": "Add docs",
		})
		if r.Status != 200 || len(r.Body["uploaded"].([]any)) != 2 || len(r.Body["errors"].([]any)) != 1 || !strings.HasPrefix(r.Body["errors"].([]any)[0].(string), "c.txt: ") {
			t.Fatalf("upload: %d %s", r.Status, r.Raw)
		}
		f := s.as(k, "GET", "/api/sandboxes/file?path=docs/a.txt", nil)
		if f.Body["content"] != "alpha\n" {
			t.Fatalf("read uploaded: %s", f.Raw)
		}
		// One commit for both files.
		dir := filepath.Join(t.TempDir(), "clone")
		u, _ := url.Parse(s.base + "/git/" + a.ID + ".git")
		u.User = url.UserPassword("x", k.Key)
		if out, err := exec.Command("git", "clone", "-q", u.String(), dir).CombinedOutput(); err != nil {
			t.Fatalf("clone: %v %s", err, out)
		}
		out, _ := exec.Command("git", "-C", dir, "log", "--format=%s").Output()
		if strings.TrimSpace(string(out)) != "Add docs" {
			t.Fatalf("commits: %q", out)
		}
		// All failing: 400, and no new commit.
		r = s.as(k, "POST", "/api/sandboxes/files", map[string]any{"files": []any{map[string]any{"url": origin.URL + "/missing", "name": "x"}}})
		if r.Status != 400 || !strings.HasPrefix(fmt.Sprint(r.Body["error"]), "All uploads failed: x: ") {
			t.Fatalf("all failing: %d %s", r.Status, r.Raw)
		}
		// Metadata addresses stay refused even when private ones are allowed.
		for _, target := range []string{"http://169.254.169.254/latest/meta-data/", origin.URL + "/to-metadata"} {
			r = s.as(k, "POST", "/api/sandboxes/files", map[string]any{"files": []any{map[string]any{"url": target, "name": "m"}}})
			if r.Status != 400 {
				t.Fatalf("metadata %s: %d %s", target, r.Status, r.Raw)
			}
		}
	})

	t.Run("private addresses refused by default", func(t *testing.T) {
		s := startServer(t, filepath.Join(t.TempDir(), "up.db"))
		a := s.createAccount("uploader", false)
		k := s.createKey(a.ID)
		redirector := httptest.NewServer(http.RedirectHandler(origin.URL+"/a.txt", http.StatusFound))
		defer redirector.Close()
		for _, target := range []string{origin.URL + "/a.txt", "http://127.0.0.1:1/x", "http://169.254.169.254/", redirector.URL} {
			r := s.as(k, "POST", "/api/sandboxes/files", map[string]any{"files": []any{map[string]any{"url": target, "name": "x"}}})
			if r.Status != 400 || !strings.Contains(fmt.Sprint(r.Body["error"]), "not allowed") {
				t.Fatalf("%s: %d %s", target, r.Status, r.Raw)
			}
		}
	})
}
