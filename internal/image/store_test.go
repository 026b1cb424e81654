package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeBuilder stands in for debootstrap so the Store's caching, locking and
// publishing can be tested in milliseconds. It writes a tiny root filesystem
// with a dpkg status and an npm global, then runs hook if set.
type fakeBuilder struct {
	hook func(ctx context.Context, req buildRequest) error

	mu         sync.Mutex
	calls      []buildRequest
	running    int
	maxRunning int
}

func (f *fakeBuilder) build(ctx context.Context, req buildRequest) error {
	f.mu.Lock()
	f.calls = append(f.calls, req)
	n := len(f.calls)
	f.running++
	f.maxRunning = max(f.maxRunning, f.running)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.running--
		f.mu.Unlock()
	}()

	files := map[string]string{
		"etc/marker":          fmt.Sprintf("%s build %d\n", req.Template.Name, n),
		"var/lib/dpkg/status": "Package: git\nStatus: install ok installed\nVersion: 1:2.39.5-0+deb12u2\n\nPackage: curl\nStatus: install ok installed\nVersion: 7.88.1-10\n",
		"usr/local/lib/node_modules/npm/package.json": `{"name":"npm","version":"12.2.2"}`,
	}
	for name, content := range files {
		p := filepath.Join(req.Rootfs, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	req.Report(Event{Stage: "fake", Percent: 50})
	if f.hook != nil {
		return f.hook(ctx, req)
	}
	return nil
}

func (f *fakeBuilder) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func testTemplates() []Template {
	return []Template{
		{Name: "small", Suite: "bookworm", Variant: "minbase", Packages: []string{"git", "curl"}, Highlights: []string{"git", "npm"}},
		{Name: "derived", Parent: "small", Steps: []Step{{Name: "s", Argv: []string{"true"}}}},
		{Name: "loop-a", Parent: "loop-b"},
		{Name: "loop-b", Parent: "loop-a"},
	}
}

func newTestStore(t *testing.T, b *fakeBuilder, h slog.Handler) *Store {
	t.Helper()
	if h == nil {
		h = slog.DiscardHandler
	}
	s := newStore(t.TempDir(), slog.New(h), b, testTemplates())
	s.hostMirrors = func(string) (Mirrors, error) {
		return Mirrors{Main: "http://mirror.example/debian", Security: "http://mirror.example/debian-security"}, nil
	}
	return s
}

// cacheEntries lists the names in the store's directory.
func cacheEntries(t *testing.T, s *Store) []string {
	t.Helper()
	entries, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func readMarker(t *testing.T, img *Image) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(img.Rootfs, "etc/marker"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBuildPublishesAndCaches(t *testing.T) {
	ctx := context.Background()
	b := &fakeBuilder{}
	s := newTestStore(t, b, nil)

	img, err := s.Ensure(ctx, "small", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := s.resolve("small")
	if img.ID != imageID("small", key) || img.Key != key || img.Template != "small" {
		t.Errorf("image = %s/%s/%s, want key %s", img.ID, img.Template, img.Key, key)
	}
	if img.Rootfs != filepath.Join(s.Dir(), img.ID, "rootfs") {
		t.Errorf("rootfs = %s", img.Rootfs)
	}
	if got := readMarker(t, img); got != "small build 1\n" {
		t.Errorf("marker = %q", got)
	}
	if img.Size <= 0 || img.CreatedAt.IsZero() || img.Mirror != "http://mirror.example/debian" {
		t.Errorf("size %d, created %v, mirror %q", img.Size, img.CreatedAt, img.Mirror)
	}
	if len(img.Packages) != 3 {
		t.Errorf("packages = %+v, want git, curl and npm", img.Packages)
	}
	if len(img.Highlights) != 2 || img.Highlights[0].Name != "git" || img.Highlights[1].Version != "12.2.2" {
		t.Errorf("highlights = %+v", img.Highlights)
	}
	st, err := os.Stat(filepath.Join(s.Dir(), img.ID))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o755 {
		t.Errorf("image directory mode %v, want 0755", st.Mode().Perm())
	}
	if got := strings.Join(cacheEntries(t, s), " "); got != img.ID+" "+img.ID+".lock" {
		t.Errorf("cache holds %q, want the image and its lock only", got)
	}

	js, err := json.Marshal(img)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(js, &fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "template", "key", "rootfs", "size", "created", "build_seconds", "packages", "highlights"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("image JSON lacks %s: %s", k, js)
		}
	}

	again, err := s.Ensure(ctx, "small", nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.callCount() != 1 || again.ID != img.ID {
		t.Errorf("second Ensure built again (calls %d) or returned %s", b.callCount(), again.ID)
	}
	if got, err := s.Lookup("small"); err != nil || got.ID != img.ID {
		t.Errorf("Lookup = %v, %v", got, err)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != img.ID {
		t.Errorf("List = %v, %v", list, err)
	}
	// A new store on the same directory (another process) sees it too.
	other := newStore(filepath.Dir(s.Dir()), nil, b, testTemplates())
	if got, err := other.Ensure(ctx, "small", nil); err != nil || got.ID != img.ID || b.callCount() != 1 {
		t.Errorf("other store: %v, %v, calls %d", got, err, b.callCount())
	}
}

func TestBuildForceReplaces(t *testing.T) {
	ctx := context.Background()
	b := &fakeBuilder{}
	s := newTestStore(t, b, nil)
	first, err := s.Build(ctx, "small", BuildOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Build(ctx, "small", BuildOptions{Force: true, Mirror: "http://other.example/debian"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.callCount() != 2 || second.ID != first.ID {
		t.Fatalf("calls %d, ids %s %s", b.callCount(), first.ID, second.ID)
	}
	if got := readMarker(t, second); got != "small build 2\n" {
		t.Errorf("marker after force = %q", got)
	}
	if second.Mirror != "http://other.example/debian" || second.SecurityMirror != "http://mirror.example/debian-security" {
		t.Errorf("mirrors = %q, %q", second.Mirror, second.SecurityMirror)
	}
	if got := strings.Join(cacheEntries(t, s), " "); got != first.ID+" "+first.ID+".lock" {
		t.Errorf("cache holds %q after a forced rebuild", got)
	}
}

func TestBuildFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("debootstrap exploded")
	b := &fakeBuilder{hook: func(context.Context, buildRequest) error { return boom }}
	s := newTestStore(t, b, nil)
	_, err := s.Ensure(ctx, "small", nil)
	if !errors.Is(err, boom) {
		t.Fatalf("Ensure = %v, want the builder's error", err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 0 {
		t.Errorf("List after failure = %v, %v", list, err)
	}
	for _, name := range cacheEntries(t, s) {
		if !strings.HasSuffix(name, ".lock") {
			t.Errorf("failed build left %s", name)
		}
	}
	if _, err := s.Lookup("small"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Lookup after failure = %v, want not exist", err)
	}
}

func TestBuildCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	b := &fakeBuilder{hook: func(ctx context.Context, _ buildRequest) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	}}
	s := newTestStore(t, b, nil)
	if _, err := s.Ensure(ctx, "small", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ensure = %v, want context.Canceled", err)
	}
	for _, name := range cacheEntries(t, s) {
		if !strings.HasSuffix(name, ".lock") {
			t.Errorf("cancelled build left %s", name)
		}
	}
}

// TestCrashLeftovers simulates a process that died mid-build (a temporary
// directory, even one with a manifest) and one that died mid-replace (an
// image directory without a manifest): neither counts as an image, and the
// next build cleans them up.
func TestCrashLeftovers(t *testing.T) {
	ctx := context.Background()
	b := &fakeBuilder{}
	s := newTestStore(t, b, nil)
	_, key, err := s.resolve("small")
	if err != nil {
		t.Fatal(err)
	}
	id := imageID("small", key)
	crashed := filepath.Join(s.Dir(), ".build-"+id+"-12345")
	if err := os.MkdirAll(filepath.Join(crashed, "rootfs/etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeManifest(crashed, manifest{ID: id, Template: "small", Key: key}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir(), id, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir(), ".old-"+id+"-999", id), 0o755); err != nil {
		t.Fatal(err)
	}

	// And an image whose manifest got damaged.
	damaged := filepath.Join(s.Dir(), "other-000000000000")
	if err := os.MkdirAll(damaged, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(damaged, manifestName), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 0 {
		t.Errorf("List with only leftovers = %v, %v", list, err)
	}
	if err := os.RemoveAll(damaged); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup("small"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Lookup of an image without manifest = %v, want not exist", err)
	}
	img, err := s.Ensure(ctx, "small", nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.callCount() != 1 || readMarker(t, img) != "small build 1\n" {
		t.Errorf("calls %d", b.callCount())
	}
	if got := strings.Join(cacheEntries(t, s), " "); got != id+" "+id+".lock" {
		t.Errorf("cache holds %q after cleanup", got)
	}
}

func TestConcurrentBuildsBuildOnce(t *testing.T) {
	ctx := context.Background()
	h := &recordHandler{}
	release := make(chan struct{})
	b := &fakeBuilder{hook: func(ctx context.Context, _ buildRequest) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	s := newTestStore(t, b, h)
	// Several stores on one directory, as several processes would have.
	const n = 4
	var wg sync.WaitGroup
	ids := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		st := s
		if i > 0 {
			st = newStore(filepath.Dir(s.Dir()), slog.New(h), b, testTemplates())
			st.hostMirrors = s.hostMirrors
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := st.Ensure(ctx, "small", nil)
			errs[i] = err
			if img != nil {
				ids[i] = img.ID
			}
		}()
	}
	// Release the build once the other n-1 are waiting on the lock.
	deadline := time.After(30 * time.Second)
	for waiting := 0; waiting < n-1; {
		select {
		case <-deadline:
			t.Fatalf("only %d builds waited for the lock", waiting)
		case <-time.After(10 * time.Millisecond):
		}
		waiting = 0
		h.mu.Lock()
		for _, r := range h.records {
			if strings.HasPrefix(r.Message, "waiting for another build") {
				waiting++
			}
		}
		h.mu.Unlock()
	}
	close(release)
	wg.Wait()
	for i := range n {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Errorf("build %d: %s, %v", i, ids[i], errs[i])
		}
	}
	if b.callCount() != 1 || b.maxRunning != 1 {
		t.Errorf("builder ran %d times, %d at once; want once", b.callCount(), b.maxRunning)
	}
}

func TestBuildWaitsForLockUntilContextEnds(t *testing.T) {
	b := &fakeBuilder{}
	s := newTestStore(t, b, nil)
	_, key, _ := s.resolve("small")
	if err := os.MkdirAll(s.Dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	// Another process holds the lock: flock(1) from util-linux, the way
	// an operator's script would.
	lock := filepath.Join(s.Dir(), imageID("small", key)+".lock")
	holder := exec.Command("flock", lock, "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Skipf("flock(1) unavailable: %v", err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	for deadline := time.Now().Add(30 * time.Second); !held(lock); {
		if time.Now().After(deadline) {
			t.Fatal("flock(1) never took the lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := s.Ensure(ctx, "small", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ensure under a held lock = %v, want deadline exceeded", err)
	}
	if b.callCount() != 0 {
		t.Errorf("builder ran while another process held the lock")
	}
}

// held reports whether someone else holds an flock on path.
func held(path string) bool {
	return exec.Command("flock", "--nonblock", path, "true").Run() != nil
}

func TestDerivedTemplate(t *testing.T) {
	ctx := context.Background()
	b := &fakeBuilder{}
	s := newTestStore(t, b, nil)
	img, err := s.Build(ctx, "derived", BuildOptions{Force: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.callCount() != 2 {
		t.Fatalf("calls = %d, want parent then child", b.callCount())
	}
	parentReq, childReq := b.calls[0], b.calls[1]
	if parentReq.Template.Name != "small" || parentReq.Parent != nil {
		t.Errorf("first build = %s with parent %v", parentReq.Template.Name, parentReq.Parent)
	}
	if childReq.Template.Name != "derived" || childReq.Parent == nil || childReq.Parent.Template != "small" {
		t.Fatalf("second build = %+v", childReq)
	}
	if img.Parent != childReq.Parent.ID || img.Mirror != "http://mirror.example/debian" || img.SecurityMirror == "" {
		t.Errorf("derived image parent %q mirror %q", img.Parent, img.Mirror)
	}
	// Force rebuilds the child, not the cached parent.
	if _, err := s.Build(ctx, "derived", BuildOptions{Force: true}, nil); err != nil {
		t.Fatal(err)
	}
	if b.callCount() != 3 {
		t.Errorf("calls = %d after forcing the child, want 3", b.callCount())
	}

	// The child's key follows the parent's definition.
	_, k1, _ := s.resolve("derived")
	s.templates[0].Packages = append(s.templates[0].Packages, "jq")
	_, k2, _ := s.resolve("derived")
	if k1 == k2 {
		t.Error("derived key did not change with its parent's packages")
	}
}

func TestResolveErrors(t *testing.T) {
	s := newTestStore(t, &fakeBuilder{}, nil)
	for name, want := range map[string]string{
		"nope":   `unknown template "nope"`,
		"loop-a": "cycle",
	} {
		if _, _, err := s.resolve(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("resolve(%s) = %v, want %q", name, err, want)
		}
		if _, err := s.Ensure(context.Background(), name, nil); err == nil {
			t.Errorf("Ensure(%s) succeeded", name)
		}
	}
}

func TestExt4(t *testing.T) {
	if _, err := lookTool("mkfs.ext4"); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	s := newTestStore(t, &fakeBuilder{}, nil)
	img, err := s.Ensure(ctx, "small", nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := img.Ext4(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(s.Dir(), img.ID, "rootfs.ext4") {
		t.Errorf("ext4 path = %s", p)
	}
	st1, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st1.Mode().Perm() != 0o644 {
		t.Errorf("ext4 image mode %v, want 0644", st1.Mode().Perm())
	}
	if st1.Size() < 128<<20 {
		t.Errorf("ext4 image is %d bytes, want room to spare", st1.Size())
	}
	if e2fsck, err := lookTool("e2fsck"); err == nil {
		if out, err := exec.Command(e2fsck, "-fn", p).CombinedOutput(); err != nil {
			t.Errorf("e2fsck: %v\n%s", err, out)
		}
	}
	if debugfs, err := lookTool("debugfs"); err == nil {
		out, err := exec.Command(debugfs, "-R", "cat /etc/marker", p).Output()
		if err != nil || string(out) != "small build 1\n" {
			t.Errorf("debugfs cat /etc/marker = %q, %v", out, err)
		}
	}
	// Built once: a second call returns the same file untouched.
	again, err := img.Ext4(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st2, err := os.Stat(again)
	if err != nil {
		t.Fatal(err)
	}
	if again != p || !st2.ModTime().Equal(st1.ModTime()) {
		t.Error("second Ext4 rebuilt the file")
	}
	leftovers, _ := filepath.Glob(filepath.Join(s.Dir(), img.ID, ".rootfs.ext4*"))
	if len(leftovers) > 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

func TestBuildWithoutHostMirrors(t *testing.T) {
	ctx := context.Background()
	b := &fakeBuilder{}
	s := newTestStore(t, b, nil)
	s.hostMirrors = func(string) (Mirrors, error) { return Mirrors{}, errors.New("no Debian mirror in /etc/apt") }
	if _, err := s.Ensure(ctx, "small", nil); err == nil || !strings.Contains(err.Error(), "no Debian mirror") {
		t.Fatalf("Ensure without mirrors = %v", err)
	}
	img, err := s.Build(ctx, "small", BuildOptions{Mirror: "http://given.example/debian"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.calls[0].Mirrors; got != (Mirrors{Main: "http://given.example/debian"}) || img.Mirror != got.Main {
		t.Errorf("builder got mirrors %+v, image %q", got, img.Mirror)
	}
}

// recordHandler keeps the records logged through it.
type recordHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }
