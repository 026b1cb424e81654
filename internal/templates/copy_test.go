package templates_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// gzArchive is a gzipped tar of hdrs; a regular file's content is
// files[name].
func gzArchive(t *testing.T, files map[string]string, hdrs ...*tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(files[h.Name]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, files[h.Name])
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func hashOf(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestUploadedFiles: an account's archive is stored under its name and
// seen by that account only; a hostile or oversized one is refused and
// nothing is recorded; a signed link uploads for its account and hash
// alone, until it expires.
func TestUploadedFiles(t *testing.T) {
	f := newFixture(t)
	svc := stepsService(t, f, newFakeHost(), 0)
	ctx := t.Context()
	good := gzArchive(t, map[string]string{"a.txt": "a"}, &tar.Header{Typeflag: tar.TypeReg, Name: "a.txt", Mode: 0o644})
	h := hashOf(good)

	if _, ok, err := svc.HasFiles(ctx, f.alice, h); err != nil || ok {
		t.Fatalf("before: %v %v", ok, err)
	}
	info, err := svc.PutFiles(ctx, f.alice, h, bytes.NewReader(good))
	if err != nil || info.Size != int64(len(good)) || info.Entries != 1 || info.Bytes != 1 {
		t.Fatalf("put: %+v %v", info, err)
	}
	if _, ok, err := svc.HasFiles(ctx, f.alice, h); err != nil || !ok {
		t.Fatalf("alice after: %v %v", ok, err)
	}
	if _, ok, _ := svc.HasFiles(ctx, f.bob, h); ok {
		t.Fatal("bob sees alice's files")
	}
	_, err = svc.PutFiles(ctx, f.alice, "ABC", bytes.NewReader(good))
	wantClass(t, "a bad name", err, errdefs.ErrInvalid, "not 64 lower-case hex digits")
	bad := gzArchive(t, nil, &tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: "/etc/passwd"})
	_, err = svc.PutFiles(ctx, f.alice, hashOf(bad), bytes.NewReader(bad))
	wantClass(t, "a hostile archive", err, errdefs.ErrInvalid, "absolute path")
	if _, ok, _ := svc.HasFiles(ctx, f.alice, hashOf(bad)); ok {
		t.Fatal("a refused archive was recorded")
	}

	// Over the bound as sent.
	small, err := templates.New(templates.Config{Store: f.st, NodeID: "here", Dir: f.dir, Blobs: blobsOf(t), MaxUploadBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	big := gzArchive(t, map[string]string{"r": strings.Repeat("random?", 0)}, &tar.Header{Typeflag: tar.TypeReg, Name: "r", Mode: 0o644})
	big = append(big, make([]byte, 1024)...)
	_, err = small.PutFiles(ctx, f.alice, hashOf(big), bytes.NewReader(big))
	wantClass(t, "an archive over the bound", err, errdefs.ErrTooLarge, "larger than 512 B")

	// Signed links.
	now := time.Now()
	l := svc.SignUpload(f.alice.AccountID, h, now)
	if _, err := svc.PutSignedFiles(ctx, h, l, now, bytes.NewReader(good)); err != nil {
		t.Fatalf("a signed upload: %v", err)
	}
	other := hashOf([]byte("other"))
	_, err = svc.PutSignedFiles(ctx, other, l, now, bytes.NewReader(good))
	wantClass(t, "another hash", err, errdefs.ErrForbidden, "not valid for these files")
	forged := l
	forged.AccountID = f.bob.AccountID
	_, err = svc.PutSignedFiles(ctx, h, forged, now, bytes.NewReader(good))
	wantClass(t, "another account", err, errdefs.ErrForbidden, "not valid")
	later := l
	later.Expires += 3600
	_, err = svc.PutSignedFiles(ctx, h, later, now, bytes.NewReader(good))
	wantClass(t, "a later expiry", err, errdefs.ErrForbidden, "not valid")
	_, err = svc.PutSignedFiles(ctx, h, l, now.Add(2*time.Hour), bytes.NewReader(good))
	wantClass(t, "an expired link", err, errdefs.ErrForbidden, "expired")
	// Another server's key (no shared secret) signs other links.
	elsewhere := stepsService(t, f, newFakeHost(), 0)
	_, err = elsewhere.PutSignedFiles(ctx, h, l, now, bytes.NewReader(good))
	wantClass(t, "another server's link", err, errdefs.ErrForbidden, "not valid")
}

// copyFS is filecopy.FS over a fake sandbox's files, with directories
// and modes of its own.
type copyFS struct {
	sb    *runtimefake.Sandbox
	mu    *sync.Mutex
	dirs  map[string]bool
	modes map[string]fs.FileMode
}

func (c copyFS) Stat(ctx context.Context, p string) (filecopy.Entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.sb.File(p); ok {
		return filecopy.Entry{Name: path.Base(p), Mode: c.modes[p]}, nil
	}
	if c.dirs[p] || p == "/" {
		return filecopy.Entry{Name: path.Base(p), Mode: fs.ModeDir | 0o755}, nil
	}
	return filecopy.Entry{}, fs.ErrNotExist
}

func (c copyFS) ListDir(ctx context.Context, p string) ([]filecopy.Entry, error) {
	return nil, errors.New("not used")
}

func (c copyFS) ReadFile(ctx context.Context, p string) (io.ReadCloser, error) {
	return c.sb.ReadFile(ctx, p)
}

func (c copyFS) WriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) error {
	c.mu.Lock()
	c.modes[p] = mode
	c.mu.Unlock()
	return c.sb.WriteFile(ctx, p, r, mode)
}

func (c copyFS) MakeDir(ctx context.Context, p string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ; p != "/"; p = path.Dir(p) {
		c.dirs[p] = true
	}
	return nil
}

// TestBuildWithCopy: COPY steps in a build: the files land where
// Docker's rules put them (a directory's contents, a file into a
// directory, relative to WORKDIR), links, owners and modes are set by
// commands in the build sandbox, the layer is captured and cached under
// a key that covers the files, and a COPY of files never uploaded is
// refused at the request.
func TestBuildWithCopy(t *testing.T) {
	f := newFixture(t)
	host := newFakeHost()
	var mu sync.Mutex
	var cmds []string
	host.rt.SetExec(func(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		mu.Lock()
		cmds = append(cmds, strings.Join(req.Cmd, " "))
		mu.Unlock()
		return runtime.ExecResult{}, nil
	})
	svc := stepsService(t, f, host, 0)
	// The build sandboxes COPY wrote into, in order (their files stay
	// readable once they are destroyed).
	var copied []*runtimefake.Sandbox
	written := func(i int) map[string][]byte { return copied[i].Files() }
	templates.SetFilesOf(svc, func(ctx context.Context, rsb runtime.Sandbox) (filecopy.FS, error) {
		sb := rsb.(*runtimefake.Sandbox)
		copied = append(copied, sb)
		return copyFS{sb: sb, mu: &mu, dirs: map[string]bool{"/srv": true}, modes: map[string]fs.FileMode{}}, nil
	})
	ctx := t.Context()
	ref := f.push(t, "tools/base:1", v1.Config{User: "app"}, map[string]string{"etc/hostname": "x\n"})
	files := map[string]string{"app/main.py": "main", "app/sub/x": "x", "run.sh": "run"}
	archive := gzArchive(t, files,
		&tar.Header{Typeflag: tar.TypeDir, Name: "app/", Mode: 0o755},
		&tar.Header{Typeflag: tar.TypeReg, Name: "app/main.py", Mode: 0o644},
		&tar.Header{Typeflag: tar.TypeSymlink, Name: "app/link", Linkname: "main.py"},
		&tar.Header{Typeflag: tar.TypeDir, Name: "app/sub/", Mode: 0o700},
		&tar.Header{Typeflag: tar.TypeReg, Name: "app/sub/x", Mode: 0o600},
		&tar.Header{Typeflag: tar.TypeReg, Name: "run.sh", Mode: 0o755},
	)
	h := hashOf(archive)
	stepsJSON := steps(t,
		`{"type":"WORKDIR","args":["/srv"]}`,
		`{"type":"COPY","args":["app","app/","",""],"filesHash":"`+h+`"}`,
		`{"type":"COPY","args":["run.sh","/usr/bin/tool","root","0750"],"filesHash":"`+h+`"}`,
	)
	_, err := svc.Build(ctx, f.alice, templates.BuildRequest{Name: "c:1", Image: ref, Steps: stepsJSON})
	wantClass(t, "files never uploaded", err, errdefs.ErrInvalid, "steps[1] (COPY app): the files "+h+" are not uploaded")
	if _, err := svc.PutFiles(ctx, f.alice, h, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	got := build(t, f, svc, templates.BuildRequest{Name: "c:1", Image: ref, Steps: stepsJSON})
	if got.Status != store.TemplateReady {
		t.Fatalf("build: %s %s\n%s", got.Status, got.FailureReason, got.Log)
	}
	for _, want := range []string{"step 2/3: COPY app app/ (files " + h[:12] + ", owner app)", "step 2: copied 2 files, 1 directories, 1 links", "step 3/3: COPY run.sh /usr/bin/tool"} {
		if !strings.Contains(got.Log, want) {
			t.Errorf("the log has no %q:\n%s", want, got.Log)
		}
	}
	if len(copied) != 2 {
		t.Fatalf("%d build sandboxes copied", len(copied))
	}
	for p, want := range map[string]string{"/srv/app/main.py": "main", "/srv/app/sub/x": "x"} {
		if string(written(0)[p]) != want {
			t.Errorf("%s: %q, want %q (files %v)", p, written(0)[p], want, written(0))
		}
	}
	if string(written(1)["/usr/bin/tool"]) != "run" {
		t.Errorf("/usr/bin/tool: %q", written(1)["/usr/bin/tool"])
	}
	mu.Lock()
	all := strings.Join(cmds, "\n")
	mu.Unlock()
	for _, want := range []string{
		"ln -sfn", "s main.py /srv/app/link",
		// The current USER owns a JSON step's files; a new destination
		// directory too.
		"chown -h app: -- /srv/app /srv/app/main.py /srv/app/link /srv/app/sub /srv/app/sub/x",
		"chmod 0700 -- /srv/app/sub",
		// Root's needs no chown; the mode is set on the file.
		"chmod 0750 -- /usr/bin/tool",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no %q among the commands:\n%s", want, all)
		}
	}
	if strings.Contains(all, "chown -h root") {
		t.Errorf("root's files were chowned:\n%s", all)
	}

	// Rebuilt: every COPY is cached; other files under the same source
	// are not.
	got = build(t, f, svc, templates.BuildRequest{Name: "c:2", Image: ref, Steps: stepsJSON})
	if got.Status != store.TemplateReady || !strings.Contains(got.Log, "step 3/3: cached") || len(copied) != 2 {
		t.Fatalf("rebuild: %s %d\n%s", got.Status, len(copied), got.Log)
	}
	other := gzArchive(t, map[string]string{"app/main.py": "v2"}, &tar.Header{Typeflag: tar.TypeReg, Name: "app/main.py", Mode: 0o644},
		&tar.Header{Typeflag: tar.TypeReg, Name: "run.sh", Mode: 0o755})
	if _, err := svc.PutFiles(ctx, f.alice, hashOf(other), bytes.NewReader(other)); err != nil {
		t.Fatal(err)
	}
	got = build(t, f, svc, templates.BuildRequest{Name: "c:3", Image: ref, Steps: json.RawMessage(strings.ReplaceAll(string(stepsJSON), h, hashOf(other)))})
	if got.Status != store.TemplateReady || strings.Contains(got.Log, "step 2/3: cached") || string(written(2)["/srv/app/main.py"]) != "v2" {
		t.Fatalf("new files: %s\n%s", got.Status, got.Log)
	}

	// Other bytes uploaded under the first name: its COPY is not taken
	// from the cache (the key names the content, not the name), and
	// copies them; the same bytes as c:3's under it are c:3's layers.
	third := gzArchive(t, map[string]string{"app/main.py": "v3"}, &tar.Header{Typeflag: tar.TypeReg, Name: "app/main.py", Mode: 0o644},
		&tar.Header{Typeflag: tar.TypeReg, Name: "run.sh", Mode: 0o755})
	if _, err := svc.PutFiles(ctx, f.alice, h, bytes.NewReader(third)); err != nil {
		t.Fatal(err)
	}
	got = build(t, f, svc, templates.BuildRequest{Name: "c:5", Image: ref, Steps: stepsJSON})
	if got.Status != store.TemplateReady || strings.Contains(got.Log, "step 2/3: cached") || string(written(len(copied) - 2)["/srv/app/main.py"]) != "v3" {
		t.Fatalf("files replaced under their name: %s\n%s", got.Status, got.Log)
	}
	if _, err := svc.PutFiles(ctx, f.alice, h, bytes.NewReader(other)); err != nil {
		t.Fatal(err)
	}
	got = build(t, f, svc, templates.BuildRequest{Name: "c:6", Image: ref, Steps: stepsJSON})
	if got.Status != store.TemplateReady || !strings.Contains(got.Log, "step 3/3: cached") {
		t.Fatalf("c:3's files again under another name: %s\n%s", got.Status, got.Log)
	}

	// A source that matches nothing fails the build naming the step.
	got = build(t, f, svc, templates.BuildRequest{Name: "c:4", Image: ref, Steps: steps(t, `{"type":"COPY","args":["nope/*","/x/","",""],"filesHash":"`+h+`"}`)})
	if got.Status != store.TemplateFailed || got.FailureReason != `step 1 (COPY nope/*): "nope/*" matches nothing in the uploaded files` {
		t.Fatalf("a source that matches nothing: %s %q", got.Status, got.FailureReason)
	}
}

func blobsOf(t *testing.T) blob.Store {
	t.Helper()
	b, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}
