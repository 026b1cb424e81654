package api

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/store"
)

// memFS is a sandbox's filesystem in memory: file contents by path, and
// the directories.
type memFS struct {
	mu    sync.Mutex
	files map[string]string
	dirs  map[string]bool
}

func newMemFS() *memFS {
	return &memFS{files: map[string]string{}, dirs: map[string]bool{"/": true}}
}

func (m *memFS) Stat(_ context.Context, p string) (filecopy.Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.files[p]; ok {
		return filecopy.Entry{Name: path.Base(p), Size: int64(len(c)), Mode: 0o644}, nil
	}
	if m.dirs[p] {
		return filecopy.Entry{Name: path.Base(p), Mode: fs.ModeDir | 0o755}, nil
	}
	return filecopy.Entry{}, fs.ErrNotExist
}

func (m *memFS) ListDir(ctx context.Context, dir string) ([]filecopy.Entry, error) {
	var out []filecopy.Entry
	m.mu.Lock()
	var names []string
	for p := range m.files {
		names = append(names, p)
	}
	for p := range m.dirs {
		names = append(names, p)
	}
	m.mu.Unlock()
	for _, p := range names {
		if p != "/" && path.Dir(p) == dir {
			e, _ := m.Stat(ctx, p)
			out = append(out, e)
		}
	}
	return out, nil
}

func (m *memFS) ReadFile(_ context.Context, p string) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return io.NopCloser(strings.NewReader(m.files[p])), nil
}

func (m *memFS) WriteFile(_ context.Context, p string, r io.Reader, _ fs.FileMode) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[p] = string(data)
	return nil
}

func (m *memFS) MakeDir(_ context.Context, p string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ; p != "/"; p = path.Dir(p) {
		m.dirs[p] = true
	}
	return nil
}

// memFiles is the file service over one memFS for every sandbox, with
// the real archives of package filecopy.
type memFiles struct{ fs *memFS }

func (f memFiles) StatPath(ctx context.Context, _ auth.Principal, _, p string) (string, filecopy.Entry, error) {
	p, err := filecopy.Resolve(p)
	if err != nil {
		return p, filecopy.Entry{}, err
	}
	e, err := f.fs.Stat(ctx, p)
	if err != nil {
		return p, e, errdefs.Newf(errdefs.ErrNotFound, "No such file or directory in the sandbox: %s", p)
	}
	return p, e, nil
}

func (f memFiles) ArchiveOut(ctx context.Context, _ auth.Principal, _, p string, lim filecopy.Limits) (*filecopy.Archive, error) {
	return filecopy.Walk(ctx, f.fs, p, lim)
}

func (f memFiles) ExtractIn(ctx context.Context, _ auth.Principal, _, dir string, r io.Reader, lim filecopy.Limits) (filecopy.Extracted, error) {
	return filecopy.Extract(ctx, f.fs, dir, r, lim)
}

// filesFixture is the websocket fixture's sandboxes with a file service.
func filesFixture(t *testing.T) (*wsFixture, *memFS) {
	t.Helper()
	w := newWSFixture(t, nil)
	mem := newMemFS()
	srv, err := New(Options{Store: w.st, Auth: auth.NewAuthenticator(w.st), Version: "test", Sandboxes: fakeExec{}, SandboxFiles: memFiles{mem}})
	if err != nil {
		t.Fatal(err)
	}
	w.srv = srv
	return w, mem
}

// doWith is fixture.do with a key of the test's choice and a raw body.
func doWith(srv *Server, key, method, target string, body io.Reader) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, body)
	req.Header.Set("x-api-key", key)
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	return rec
}

// tarOf is an archive of name → content ("/" suffix: a directory).
func tarOf(t *testing.T, entries ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range entries {
		hdr := &tar.Header{Name: name, Mode: 0o644, ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Size: int64(len("data of " + name))}
		if strings.HasSuffix(name, "/") {
			hdr.Typeflag, hdr.Size, hdr.Mode = tar.TypeDir, 0, 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			_, _ = tw.Write([]byte("data of " + name))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestSandboxFilesRoundTrip: an archive put into a sandbox's directory
// comes back out of it, and its paths are described by stat.
func TestSandboxFilesRoundTrip(t *testing.T) {
	w, _ := filesFixture(t)
	base := "/api/sandboxes/" + w.sandbox + "/files"
	rec := doWith(w.srv, w.key, "PUT", base+"?path=proj", bytes.NewReader(tarOf(t, "src/", "src/main.go", "README")))
	if rec.Code != 200 || rec.Body.String() != `{"status":"success","files":2,"directories":1,"bytes":33}`+"\n" {
		t.Fatalf("put: %d %s", rec.Code, rec.Body)
	}

	rec = doWith(w.srv, w.key, "GET", base+"?path=/workspace/proj/src", nil)
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/x-tar" {
		t.Fatalf("get: %d %s", rec.Code, rec.Body)
	}
	tr := tar.NewReader(rec.Body)
	var got []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		got = append(got, hdr.Name+"="+string(data))
	}
	if fmt.Sprint(got) != "[src/= src/main.go=data of src/main.go]" {
		t.Fatalf("archive %q", got)
	}

	rec = doWith(w.srv, w.key, "GET", base+"/stat?path=proj/README", nil)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"path":"/workspace/proj/README","type":"file","size":14,"mode":"0644"`) {
		t.Fatalf("stat: %d %s", rec.Code, rec.Body)
	}
	for target, want := range map[string]string{
		base + "/stat?path=nothing": `404 {"status":"error","error":"No such file or directory in the sandbox: /workspace/nothing"}`,
		base + "?path=nothing":      `404 {"status":"error","error":"No such file or directory in the sandbox: /workspace/nothing"}`,
		base:                        `400 {"status":"error","error":"path is required"}`,
		base + "?path=":             `400 {"status":"error","error":"path cannot be empty"}`,
	} {
		if rec := doWith(w.srv, w.key, "GET", target, nil); fmt.Sprint(rec.Code, " ", strings.TrimSpace(rec.Body.String())) != want {
			t.Errorf("GET %s: %d %s, want %s", target, rec.Code, rec.Body, want)
		}
	}
}

// TestSandboxFilesRefusals: who may not copy (a sandbox's key, in either
// direction; another account), and archives that are not taken.
func TestSandboxFilesRefusals(t *testing.T) {
	w, mem := filesFixture(t)
	archive := tarOf(t, "a")
	for _, c := range []struct {
		key, method, id, query string
		body                   []byte
		want                   int
	}{
		{w.sandboxKey, "PUT", w.sandbox, "?path=x", archive, http.StatusForbidden},
		{w.sandboxKey, "GET", w.sandbox, "?path=x", nil, http.StatusForbidden},
		{w.sandboxKey, "GET", w.sandbox, "/stat?path=x", nil, http.StatusForbidden},
		{w.key, "PUT", w.other, "?path=x", archive, http.StatusNotFound},
		{w.key, "GET", w.other, "?path=x", nil, http.StatusNotFound},
		{w.key, "PUT", w.sandbox, "?path=x", tarOf(t, "../../etc/passwd"), http.StatusBadRequest},
		{w.key, "PUT", w.sandbox, "?path=x", []byte("not a tar archive, but long enough to be read as a header block" + strings.Repeat(".", 600)), http.StatusBadRequest},
	} {
		rec := doWith(w.srv, c.key, c.method, "/api/sandboxes/"+c.id+"/files"+c.query, bytes.NewReader(c.body))
		if rec.Code != c.want {
			t.Errorf("%s %s%s: %d %s, want %d", c.method, c.id, c.query, rec.Code, rec.Body, c.want)
		}
	}
	rec := doWith(w.srv, w.sandboxKey, "GET", "/api/sandboxes/"+w.sandbox+"/files?path=x", nil)
	if !strings.Contains(rec.Body.String(), "GET /api/sandboxes/"+w.sandbox+"/files (it reads a running sandbox's files, as an exec would) needs an account key") {
		t.Errorf("a sandbox key's refusal: %s", rec.Body)
	}
	if _, ok := mem.files["/workspace/x/a"]; ok {
		t.Error("a refused caller's archive was written")
	}
	if _, ok := mem.files["/etc/passwd"]; ok {
		t.Error("an entry outside the destination was written")
	}
}

// brokenFiles is a file service whose archive breaks off after it began.
type brokenFiles struct{ memFiles }

func (b brokenFiles) ArchiveOut(ctx context.Context, p auth.Principal, id, path string, lim filecopy.Limits) (*filecopy.Archive, error) {
	a, err := b.memFiles.ArchiveOut(ctx, p, id, path, lim)
	if err == nil {
		delete(b.fs.files, "/workspace/big") // measured, then gone
	}
	return a, err
}

// TestSandboxFilesCopyOutBreaksOff: an archive that cannot be finished
// breaks the connection instead of ending as if it were whole.
func TestSandboxFilesCopyOutBreaksOff(t *testing.T) {
	w, mem := filesFixture(t)
	mem.files["/workspace/big"] = strings.Repeat("x", 64<<10)
	srv, err := New(Options{Store: w.st, Auth: auth.NewAuthenticator(w.st), Version: "test", Sandboxes: fakeExec{}, SandboxFiles: brokenFiles{memFiles{mem}}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	req, _ := http.NewRequest("GET", ts.URL+"/api/sandboxes/"+w.sandbox+"/files?path=big", nil)
	req.Header.Set("x-api-key", w.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("%d, read: %v; want the transfer broken off", resp.StatusCode, err)
	}
}

// deletions is a sandbox service whose Delete records what it deleted.
type deletions struct {
	SandboxService
	st      *store.Store
	deleted []string
}

func (d *deletions) Delete(ctx context.Context, _ auth.Principal, id string) error {
	sb, err := d.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.Status != store.SandboxStopped {
		return errdefs.New(errdefs.ErrNotRunning, "Sandbox is running: stop it before deleting it")
	}
	d.deleted = append(d.deleted, sb.ID)
	return nil
}

// TestDeleteSandboxRoute: DELETE /api/sandboxes/{id} answers the sandbox
// it deleted, the service's refusal with its reason, 404 for another
// account's, and 403 for a sandbox's own key.
func TestDeleteSandboxRoute(t *testing.T) {
	w := newWSFixture(t, nil)
	d := &deletions{st: w.st}
	srv, err := New(Options{Store: w.st, Auth: auth.NewAuthenticator(w.st), Version: "test", Sandboxes: d})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key, id, want string
	}{
		{w.key, w.stopped, `200 {"status":"success","sandbox":{"sandboxId":"sbx_ws_stopped","sandboxStatus":"stopped"`},
		{w.key, w.sandbox, `409 {"status":"error","error":"Sandbox is running: stop it before deleting it"}`},
		{w.key, w.other, `404 {"status":"error","error":"Sandbox not found"}`},
		{w.sandboxKey, w.stopped, `403 `},
	} {
		rec := doWith(srv, c.key, "DELETE", "/api/sandboxes/"+c.id, nil)
		if got := fmt.Sprint(rec.Code, " ", rec.Body.String()); !strings.HasPrefix(got, c.want) {
			t.Errorf("DELETE %s: %s, want %s…", c.id, got, c.want)
		}
	}
	if fmt.Sprint(d.deleted) != "[sbx_ws_stopped]" {
		t.Fatalf("deleted %v", d.deleted)
	}
}
