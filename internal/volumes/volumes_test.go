package volumes

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// node is one node's volume service over a shared store and blob store.
func node(t *testing.T, st *store.Store, blobs blob.Store, id, rt string, sync bool) *Service {
	t.Helper()
	s, err := New(Config{Store: st, Blobs: blobs, Sync: sync, NodeID: id, Dir: t.TempDir(), Runtime: rt, Limits: DefaultLimits})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func requireE2fsprogs(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"mkfs.ext4", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

func account(t *testing.T, st *store.Store) string {
	t.Helper()
	a := store.Account{Name: "vol", Kind: store.AccountPersonal}
	if err := st.CreateAccount(t.Context(), &a); err != nil {
		t.Fatal(err)
	}
	return a.ID
}

// start records a sandbox of account on node with mounts, as the manager
// does, and runs the hook's Prestart: the spec's volumes.
func start(t *testing.T, s *Service, account string, mounts ...Mount) (store.Sandbox, runtime.Spec, error) {
	t.Helper()
	ctx := t.Context()
	atts, err := s.Resolve(ctx, account, mounts)
	if err != nil {
		return store.Sandbox{}, runtime.Spec{}, err
	}
	sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: account, NodeID: s.cfg.NodeID, Status: store.SandboxRunning, Runtime: s.cfg.Runtime, Volumes: atts}
	if err := s.st.CreateSandbox(ctx, &sb); err != nil {
		return sb, runtime.Spec{}, err
	}
	var spec runtime.Spec
	err = s.Prestart(ctx, sb, &spec)
	return sb, spec, err
}

// end marks sb stopped and runs the hook's Stop.
func end(t *testing.T, s *Service, sb store.Sandbox) {
	t.Helper()
	if _, err := s.st.TransitionSandbox(t.Context(), sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", sb.CreatedAt); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
}

// scribble writes marker at offset 40 MiB of img, as a sandbox writing
// through the file system would change its blocks.
func scribble(t *testing.T, img, marker string) {
	t.Helper()
	f, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(marker), 40<<20); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, img string, n int) string {
	t.Helper()
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, 40<<20); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFollowsTheSandbox: in a cluster a volume written on node A is read
// on node B (its copy through the blob store, a new generation), written
// there, and read back on A, which downloads the newer copy; a node's own
// copy of the same generation is not downloaded again.
func TestFollowsTheSandbox(t *testing.T) {
	requireE2fsprogs(t)
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	blobs, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	a := node(t, st, blobs, "node-a", "gvisor", true)
	b := node(t, st, blobs, "node-b", "gvisor", true)
	acct := account(t, st)
	if _, err := a.Create(t.Context(), acct, "data", 128*MiB); err != nil {
		t.Fatal(err)
	}
	sb, spec, err := start(t, a, acct, Mount{Name: "data", Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.Volumes) != 1 || spec.Volumes[0].Path != "/data" || spec.Volumes[0].ReadOnly {
		t.Fatalf("spec: %+v", spec.Volumes)
	}
	if v, _ := a.Get(t.Context(), acct, "data"); v.DataNode != "node-a" || len(v.Attachments) != 1 {
		t.Errorf("while written on A: %+v", v)
	}
	scribble(t, spec.Volumes[0].Image, "from-a")
	if _, _, err := start(t, b, acct, Mount{Name: "data", Path: "/x", ReadOnly: true}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a reader on B while A writes: %v, want 409", err)
	}
	end(t, a, sb)
	v, _ := a.Get(t.Context(), acct, "data")
	if v.DataNode != "" || v.BlobKey == "" || v.Generation != 1 || len(v.Attachments) != 0 {
		t.Fatalf("after A's writer ended: %+v", v)
	}
	first := v.BlobKey

	sb, spec, err = start(t, b, acct, Mount{Name: "data", Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if got := readAt(t, spec.Volumes[0].Image, 6); got != "from-a" {
		t.Fatalf("B read %q", got)
	}
	if fi, err := os.Stat(spec.Volumes[0].Image); err != nil || fi.Size() != 128*MiB {
		t.Errorf("B's image: %v %v", fi, err)
	}
	scribble(t, spec.Volumes[0].Image, "from-b")
	end(t, b, sb)
	if v, _ = b.Get(t.Context(), acct, "data"); v.Generation != 2 || v.BlobKey == first {
		t.Errorf("after B's writer ended: %+v", v)
	}
	if _, err := blobs.Stat(t.Context(), first); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("the first copy, named by no volume: %v, want collected", err)
	}

	sb, spec, err = start(t, a, acct, Mount{Name: "data", Path: "/data", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := readAt(t, spec.Volumes[0].Image, 6); got != "from-b" {
		t.Errorf("A read %q after B wrote", got)
	}
	end(t, a, sb)
	if v2, _ := a.Get(t.Context(), acct, "data"); v2.Generation != 2 || v2.BlobKey != v.BlobKey {
		t.Errorf("a reader's end changed the volume: %+v", v2)
	}

	// Resized, then attached on B read-write: B's image grows.
	if _, err := a.Resize(t.Context(), acct, "data", 192*MiB); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Resize(t.Context(), acct, "data", 128*MiB); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("shrink: %v", err)
	}
	sb, spec, err = start(t, b, acct, Mount{Name: "data", Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(spec.Volumes[0].Image); fi.Size() != 192*MiB {
		t.Errorf("after resize: image of %d bytes", fi.Size())
	}
	end(t, b, sb)

	// A fork shares the copy; deleting the source keeps it for the fork.
	f, err := a.Fork(t.Context(), acct, "data", "copy")
	if err != nil || f.BlobKey == "" {
		t.Fatalf("fork: %+v %v", f, err)
	}
	if _, err := a.Delete(t.Context(), acct, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.Stat(t.Context(), f.BlobKey); err != nil {
		t.Errorf("the fork's copy after its source went: %v", err)
	}
	sb, spec, err = start(t, a, acct, Mount{Name: "copy", Path: "/c", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := readAt(t, spec.Volumes[0].Image, 6); got != "from-b" {
		t.Errorf("the fork read %q", got)
	}
	end(t, a, sb)
}

// TestOneNode: without sync the image stays on the node, each writer's end
// is a new generation of it, a fork copies it, and a node's restart
// releases a lease its crash left (Reconcile) and removes the images of
// deleted volumes.
func TestOneNode(t *testing.T) {
	requireE2fsprogs(t)
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	s := node(t, st, nil, "only", "gvisor", false)
	acct := account(t, st)
	ctx := t.Context()
	if _, err := s.Create(ctx, acct, "data", 0); err != nil {
		t.Fatal(err)
	}
	sb, spec, err := start(t, s, acct, Mount{Name: "data", Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(spec.Volumes[0].Image); err != nil || fi.Size() != DefaultSize {
		t.Fatalf("a new volume's image: %v %v", fi, err)
	}
	scribble(t, spec.Volumes[0].Image, "kept")
	end(t, s, sb)
	v, _ := s.Get(ctx, acct, "data")
	if v.DataNode != "only" || v.BlobKey != "" || v.Generation != 1 {
		t.Errorf("after a writer: %+v", v)
	}
	f, err := s.Fork(ctx, acct, "data", "copy")
	if err != nil || f.DataNode != "only" {
		t.Fatalf("fork: %+v %v", f, err)
	}
	if got := readAt(t, s.image(f.ID), 4); got != "kept" {
		t.Errorf("the fork holds %q", got)
	}

	// A crash: the sandbox ended while the node was down; its lease is
	// still there. Reconcile releases it.
	sb, _, err = start(t, s, acct, Mount{Name: "copy", Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxFailed, "lost", sb.CreatedAt); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, acct, "copy"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete while leased: %v", err)
	}
	if err := s.Reconcile(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	// What the lost writer left in the image is the next generation.
	if got, _ := s.Get(ctx, acct, "copy"); len(got.Attachments) != 0 || got.Generation != 2 {
		t.Errorf("after reconcile: %+v", got)
	}
	// A volume deleted while this image was elsewhere's: gone at restart.
	if _, err := st.DeleteVolume(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Reconcile(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.image(f.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a deleted volume's image: %v", err)
	}
}

// TestRefusals: what a create's mounts and the volume calls refuse.
func TestRefusals(t *testing.T) {
	securitytest.Attack(t, "volumes",
		"a create mounts a volume over /proc, /workspace, a relative or unclean path, two volumes one inside the other, another account's volume, or on gVisor a volume a microVM's kernel wrote",
		"each is refused (400, 404, 409) before a row or a mount exists; the host's kernel never mounts a disk a guest wrote")
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	s := node(t, st, nil, "n", "gvisor", false)
	acct := account(t, st)
	ctx := t.Context()
	for _, c := range []struct {
		name string
		size int64
		want error
	}{
		{"ok", 64 * MiB, nil},
		{"ok", 64 * MiB, errdefs.ErrConflict},
		{"small", 32 * MiB, errdefs.ErrInvalid},
		{"odd", 64*MiB + 1, errdefs.ErrInvalid},
		{"huge", 51 * GiB, errdefs.ErrInvalid},
		{"vol_x", 64 * MiB, errdefs.ErrInvalid},
		{"-x", 64 * MiB, errdefs.ErrInvalid},
		{"a/b", 64 * MiB, errdefs.ErrInvalid},
		{strings.Repeat("a", 64), 64 * MiB, errdefs.ErrInvalid},
	} {
		if _, err := s.Create(ctx, acct, c.name, c.size); !errors.Is(err, c.want) && (c.want != nil || err != nil) {
			t.Errorf("create %q of %d: %v, want %v", c.name, c.size, err, c.want)
		}
	}
	other := account(t, st)
	if _, err := s.Get(ctx, other, "ok"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another account's volume: %v", err)
	}
	v, _ := s.Get(ctx, acct, "ok")
	if _, err := s.Get(ctx, other, v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another account's volume by id: %v", err)
	}
	for _, c := range []struct {
		mounts []Mount
		want   error
	}{
		{[]Mount{{Name: "nope", Path: "/data"}}, errdefs.ErrNotFound},
		{[]Mount{{Name: "ok", Path: "/workspace/data"}}, errdefs.ErrInvalid},
		{[]Mount{{Name: "ok", Path: "/proc/x"}}, errdefs.ErrInvalid},
		{[]Mount{{Name: "ok", Path: "/a b"}}, errdefs.ErrInvalid},
		{[]Mount{{Name: "ok", Path: "data"}}, errdefs.ErrInvalid},
		{[]Mount{{Name: "ok", Path: "/a/../b"}}, errdefs.ErrInvalid},
		{[]Mount{{Name: "ok", Path: "/a"}, {Name: v.ID, Path: "/b"}}, errdefs.ErrInvalid},
	} {
		if _, err := s.Resolve(ctx, acct, c.mounts); !errors.Is(err, c.want) {
			t.Errorf("mounts %+v: %v, want %v", c.mounts, err, c.want)
		}
	}
	if _, err := s.Create(ctx, acct, "two", 64*MiB); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, acct, []Mount{{Name: "ok", Path: "/a"}, {Name: "two", Path: "/a/b"}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("nested paths: %v", err)
	}
	// A volume a microVM wrote is not a gVisor sandbox's.
	if err := st.MarkVolumeGuestWritten(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, acct, []Mount{{Name: "ok", Path: "/a"}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a guest-written volume on gVisor: %v, want 409", err)
	}
	vm := node(t, st, nil, "n", "microvm", false)
	if _, err := vm.Resolve(ctx, acct, []Mount{{Name: "ok", Path: "/a"}}); err != nil {
		t.Errorf("a guest-written volume on a microVM: %v", err)
	}
}

// TestHostileCopy: a volume's copy from the blob store is checked before
// a byte lands outside its image: extents out of order, past its size, a
// size past the volume's, a wrong header, a cut stream.
func TestHostileCopy(t *testing.T) {
	securitytest.Attack(t, "cluster",
		"a volume's copy from the blob store has extents out of order, past its size or wrapping around, a size past the volume's, a wrong header or a cut stream",
		"each is refused as it is read; the image written never grows past the volume's size")
	type ext struct{ off, n uint64 }
	build := func(magic string, size uint64, exts []ext, end bool) []byte {
		var raw bytes.Buffer
		raw.WriteString(magic)
		_ = binary.Write(&raw, binary.BigEndian, size)
		for _, e := range exts {
			_ = binary.Write(&raw, binary.BigEndian, e.off)
			_ = binary.Write(&raw, binary.BigEndian, e.n)
			raw.Write(bytes.Repeat([]byte{'x'}, int(min(e.n, 4096))))
		}
		if end {
			_ = binary.Write(&raw, binary.BigEndian, ^uint64(0))
		}
		var z bytes.Buffer
		zw, _ := zstd.NewWriter(&z)
		_, _ = zw.Write(raw.Bytes())
		_ = zw.Close()
		return z.Bytes()
	}
	for _, c := range []struct {
		name string
		copy []byte
		ok   bool
	}{
		{"good", build(syncMagic, 1<<20, []ext{{0, 4096}, {8192, 4096}}, true), true},
		{"magic", build("sandboxd-volume-9\n", 1<<20, nil, true), false},
		{"too big", build(syncMagic, 2<<20, nil, true), false},
		{"out of order", build(syncMagic, 1<<20, []ext{{8192, 4096}, {0, 4096}}, true), false},
		{"past its size", build(syncMagic, 1<<20, []ext{{1<<20 - 100, 4096}}, true), false},
		{"wraps", build(syncMagic, 1<<20, []ext{{4096, ^uint64(0) - 10}}, true), false},
		{"cut", build(syncMagic, 1<<20, []ext{{0, 4096}}, false), false},
		{"not zstd", []byte("hello"), false},
	} {
		f, err := os.Create(filepath.Join(t.TempDir(), "img"))
		if err != nil {
			t.Fatal(err)
		}
		err = readExtents(bytes.NewReader(c.copy), f, 1<<20)
		fi, _ := f.Stat()
		f.Close()
		if (err == nil) != c.ok {
			t.Errorf("%s: %v", c.name, err)
		}
		if fi.Size() > 1<<20 {
			t.Errorf("%s: the image grew to %d bytes", c.name, fi.Size())
		}
	}
}

// TestExtentsRoundTrip: a sparse image's copy holds its data extents alone
// and reads back to the same bytes and size.
func TestExtentsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, 64<<20); err != nil {
		t.Fatal(err)
	}
	scribble(t, src, "middle")
	f, _ := os.OpenFile(src, os.O_WRONLY, 0)
	_, _ = f.WriteAt([]byte("start"), 0)
	f.Close()
	in, _ := os.Open(src)
	var copyBuf bytes.Buffer
	if err := writeExtents(&copyBuf, in); err != nil {
		t.Fatal(err)
	}
	in.Close()
	if copyBuf.Len() > 64<<10 {
		t.Errorf("a 64 MiB image with 2 blocks written made a copy of %d bytes", copyBuf.Len())
	}
	out, _ := os.Create(filepath.Join(dir, "dst"))
	if err := readExtents(&copyBuf, out, 64<<20); err != nil {
		t.Fatal(err)
	}
	out.Close()
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(filepath.Join(dir, "dst"))
	if !bytes.Equal(a, b) {
		t.Error("the copy read back differs")
	}
}

// flakyBlobs is a blob store whose Put fails while down is set (a test's
// stand-in for an unreachable S3).
type flakyBlobs struct {
	blob.Store
	down bool
}

func (f *flakyBlobs) Put(ctx context.Context, r io.Reader) (blob.Info, error) {
	if f.down {
		_, _ = io.Copy(io.Discard, r)
		return blob.Info{}, errors.New("blob store unreachable")
	}
	return f.Store.Put(ctx, r)
}

// TestSyncRetried: a writer that ends while the blob store is unreachable
// ends all the same, its data left on its node (another node's attach is
// refused, naming it); the node's retry syncs it once the store is back,
// and the other node then reads it.
func TestSyncRetried(t *testing.T) {
	requireE2fsprogs(t)
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	local, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	blobs := &flakyBlobs{Store: local, down: true}
	a := node(t, st, blobs, "node-a", "gvisor", true)
	b := node(t, st, blobs, "node-b", "gvisor", true)
	acct := account(t, st)
	if _, err := a.Create(t.Context(), acct, "data", 64*MiB); err != nil {
		t.Fatal(err)
	}
	sb, spec, err := start(t, a, acct, Mount{Name: "data", Path: "/data"})
	if err != nil {
		t.Fatal(err)
	}
	scribble(t, spec.Volumes[0].Image, "late")
	end(t, a, sb) // the sync fails; the end does not
	if v, _ := a.Get(t.Context(), acct, "data"); v.DataNode != "node-a" || len(v.Attachments) != 0 {
		t.Fatalf("after a failed sync: %+v", v)
	}
	if _, _, err := start(t, b, acct, Mount{Name: "data", Path: "/data"}); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "node-a") {
		t.Fatalf("an attach on B before the sync: %v", err)
	}
	blobs.down = false
	if err := a.syncLeft(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, spec, err = start(t, b, acct, Mount{Name: "data", Path: "/data", ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := readAt(t, spec.Volumes[0].Image, 4); got != "late" {
		t.Errorf("B read %q after the retried sync", got)
	}
}
