package templates_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// countingBlobs counts the Gets of a blob store.
type countingBlobs struct {
	blob.Store
	gets atomic.Int64
	// slow delays each Get, so that concurrent callers overlap.
	slow time.Duration
}

func (c *countingBlobs) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	c.gets.Add(1)
	time.Sleep(c.slow)
	return c.Store.Get(ctx, key)
}

// pushTar pushes an image of one layer written by write, as repo:tag.
func (f *fixture) pushTar(t *testing.T, repoTag string, write func(tw *tar.Writer)) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	write(tw)
	tw.Close()
	zw.Close()
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(buf.Bytes(), types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/bin"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(f.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// node is another node's view of the same database and blob store: a
// cache of its own.
func (f *fixture) node(t *testing.T, blobs blob.Store, opts ...templates.CatalogOption) (*templates.Catalog, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "templates")
	c, err := templates.NewCatalog(f.st, dir, blobs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, dir
}

// distributed is a fixture whose service stores images in a blob store.
func distributed(t *testing.T) (*fixture, *countingBlobs) {
	t.Helper()
	f := newFixture(t)
	local, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	blobs := &countingBlobs{Store: local}
	jc, err := jobs.New(t.Context(), f.st, jobs.Config{NodeID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	f.svc, err = templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "a", Dir: f.dir, AllowPrivate: true, Blobs: blobs})
	if err != nil {
		t.Fatal(err)
	}
	return f, blobs
}

func (f *fixture) build(t *testing.T, name, ref string) store.Template {
	t.Helper()
	tpl, err := f.svc.Build(t.Context(), f.alice, templates.BuildRequest{Name: name, Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Run(t.Context(), tpl.ID); err != nil {
		t.Fatal(err)
	}
	got, err := f.st.GetTemplate(t.Context(), tpl.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != store.TemplateReady {
		t.Fatalf("build of %s: %+v", name, got)
	}
	return got
}

// TestImageMovesBetweenNodes: a build stores its image's root filesystem
// in the blob store before it is ready; another node's catalog, whose
// cache lacks it, materialises it whole on first use (owners, setuid
// bits, hard links, symlinks as written, an empty directory, a FIFO),
// and a build of the same image there takes it from the blob store, not
// the registry. Deleting the last template of the image collects its
// blob and every node's cached copy (the other's at its Collect).
func TestImageMovesBetweenNodes(t *testing.T) {
	f, blobs := distributed(t)
	ctx := t.Context()
	mtime := time.Unix(1_700_000_000, 0)
	ref := f.pushTar(t, "tools/whole:1", func(tw *tar.Writer) {
		for _, h := range []*tar.Header{
			{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755},
			{Typeflag: tar.TypeReg, Name: "bin/su", Mode: 0o4755, Size: 5},
			{Typeflag: tar.TypeLink, Name: "bin/su-again", Linkname: "bin/su"},
			{Typeflag: tar.TypeSymlink, Name: "bin/sh", Linkname: "/bin/busybox"},
			{Typeflag: tar.TypeDir, Name: "home/app/", Mode: 0o750, Uid: 1000, Gid: 1000},
			{Typeflag: tar.TypeReg, Name: "home/app/notes", Mode: 0o600, Uid: 1000, Gid: 1001, Size: 6},
			{Typeflag: tar.TypeDir, Name: "empty/", Mode: 0o1777},
			{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o644},
			{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3},
		} {
			h.ModTime = mtime
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			switch h.Name {
			case "bin/su":
				io.WriteString(tw, "root\n")
			case "home/app/notes":
				io.WriteString(tw, "hello\n")
			}
		}
	})
	tpl := f.build(t, "whole:1", ref)
	if !strings.Contains(tpl.Log, "root filesystem stored in the blob store") {
		t.Fatalf("log lacks the store:\n%s", tpl.Log)
	}
	stored, err := f.st.GetTemplateImage(ctx, tpl.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.Stat(ctx, stored.BlobKey); err != nil {
		t.Fatal(err)
	}

	// Node b: not in its cache; the first Find brings it.
	b, bdir := f.node(t, blobs)
	img, err := b.Find(ctx, f.alice.AccountID, "whole:1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(img.RootFS, bdir) {
		t.Fatalf("rootfs %s is not in node b's cache %s", img.RootFS, bdir)
	}
	stat := func(p string) syscall.Stat_t {
		t.Helper()
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(img.RootFS, p), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := stat("bin/su"); st.Mode&0o7777 != 0o4755 || st.Nlink != 2 || st.Uid != 0 {
		t.Fatalf("bin/su: mode %o, %d links, uid %d", st.Mode&0o7777, st.Nlink, st.Uid)
	}
	if stat("bin/su").Ino != stat("bin/su-again").Ino {
		t.Fatal("the hard link is a copy")
	}
	if target, err := os.Readlink(filepath.Join(img.RootFS, "bin/sh")); err != nil || target != "/bin/busybox" {
		t.Fatalf("bin/sh -> %q %v", target, err)
	}
	if st := stat("home/app"); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o750 {
		t.Fatalf("home/app: %d:%d %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if st := stat("home/app/notes"); st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o600 || st.Mtim.Sec != mtime.Unix() {
		t.Fatalf("notes: %d:%d %o mtime %d", st.Uid, st.Gid, st.Mode&0o7777, st.Mtim.Sec)
	}
	if b, err := os.ReadFile(filepath.Join(img.RootFS, "home/app/notes")); err != nil || string(b) != "hello\n" {
		t.Fatalf("notes: %q %v", b, err)
	}
	if st := stat("empty"); st.Mode&0o7777 != 0o1777 {
		t.Fatalf("empty: %o", st.Mode&0o7777)
	}
	if st := stat("run/fifo"); st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Fatalf("fifo: %o", st.Mode)
	}
	if _, err := os.Lstat(filepath.Join(img.RootFS, "dev/null")); !os.IsNotExist(err) {
		t.Fatalf("a device node was made: %v", err)
	}
	if fi, err := os.Stat(bdir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("node b's cache: %v %v", fi, err)
	}
	entries, _ := os.ReadDir(bdir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".materialise-") {
			t.Fatalf("left behind: %s", e.Name())
		}
	}
	// ByID (a restart, a resume) finds it cached now: no other Get.
	gets := blobs.gets.Load()
	if _, err := b.ByID(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if blobs.gets.Load() != gets {
		t.Fatal("materialised twice")
	}

	// A build of the same image on node c: from the blob store.
	jc, _ := jobs.New(ctx, f.st, jobs.Config{NodeID: "c"})
	defer jc.Close()
	cdir := filepath.Join(t.TempDir(), "templates")
	c, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "c", Dir: cdir, AllowPrivate: true, Blobs: blobs})
	if err != nil {
		t.Fatal(err)
	}
	before := f.blobGets.Load()
	tpl2, err := c.Build(ctx, f.alice, templates.BuildRequest{Name: "whole:2", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Run(ctx, tpl2.ID); err != nil {
		t.Fatal(err)
	}
	got2, _ := f.st.GetTemplate(ctx, tpl2.ID)
	if got2.Status != store.TemplateReady || !strings.Contains(got2.Log, "taken from the blob store") ||
		!strings.Contains(got2.Log, "already in the blob store") {
		t.Fatalf("build on node c: %+v", got2)
	}
	if n := f.blobGets.Load() - before; n != 1 { // the config blob only
		t.Fatalf("the build on node c read %d registry blobs, want the config only", n)
	}

	// Delete both: the blob and its row go with the last; node a's cache
	// at once, node c's (where the last delete ran) too, node b's at its
	// Collect.
	if err := f.svc.Delete(ctx, f.alice, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.Stat(ctx, stored.BlobKey); err != nil {
		t.Fatalf("blob gone while whole:2 names the image: %v", err)
	}
	if err := c.Delete(ctx, f.alice, tpl2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := blobs.Stat(ctx, stored.BlobKey); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("blob kept after the last template: %v", err)
	}
	if _, err := f.st.GetTemplateImage(ctx, tpl.Digest); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("row kept: %v", err)
	}
	cached := func(dir string) bool {
		_, err := os.Stat(filepath.Join(dir, strings.ReplaceAll(tpl.Digest, ":", "-")))
		return err == nil
	}
	// Node a deleted whole:1 while whole:2 named the image: its copy
	// stays until its Collect.
	if !cached(f.dir) {
		t.Fatal("node a's copy went while whole:2 named the image")
	}
	if cached(cdir) {
		t.Fatal("node c kept its copy after the last delete there")
	}
	f.svc.Collect(ctx)
	if cached(f.dir) {
		t.Fatal("node a kept its copy after its Collect")
	}
	if !cached(bdir) {
		t.Fatal("node b's copy went without its Collect")
	}
	jb, _ := jobs.New(ctx, f.st, jobs.Config{NodeID: "b"})
	defer jb.Close()
	bsvc, err := templates.New(templates.Config{Store: f.st, Jobs: jb, NodeID: "b", Dir: bdir, Blobs: blobs})
	if err != nil {
		t.Fatal(err)
	}
	bsvc.Collect(ctx)
	if cached(bdir) {
		t.Fatal("node b kept its copy after its Collect")
	}
	for _, dir := range []string{f.dir, bdir, cdir} {
		if locks, _ := os.ReadDir(filepath.Join(dir, ".locks")); len(locks) != 0 {
			t.Fatalf("lock files left in %s: %v", dir, locks)
		}
	}
}

// TestMaterialiseOnce: concurrent first starts of a template on a node
// (through two catalogs over one cache, as the manager and the service
// hold) materialise its image once; the others wait and take it.
func TestMaterialiseOnce(t *testing.T) {
	f, blobs := distributed(t)
	ctx := t.Context()
	ref := f.push(t, "tools/once:1", v1.Config{}, map[string]string{"a": "b"})
	f.build(t, "once:1", ref)
	blobs.slow = 200 * time.Millisecond
	c1, dir := f.node(t, blobs)
	c2, err := templates.NewCatalog(f.st, dir, blobs)
	if err != nil {
		t.Fatal(err)
	}
	before := blobs.gets.Load()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	roots := make([]string, 8)
	for i := range 8 {
		wg.Go(func() {
			c := c1
			if i%2 == 1 {
				c = c2
			}
			img, err := c.Find(ctx, f.alice.AccountID, "once:1")
			errs[i], roots[i] = err, img.RootFS
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil || roots[i] != roots[0] {
			t.Fatalf("find %d: %q %v", i, roots[i], err)
		}
	}
	if n := blobs.gets.Load() - before; n != 1 {
		t.Fatalf("%d blob reads for 8 concurrent starts, want 1", n)
	}
	if b, err := os.ReadFile(filepath.Join(roots[0], "a")); err != nil || string(b) != "b" {
		t.Fatalf("a: %q %v", b, err)
	}
	// A start whose context ends while it waits gives up, not the others'.
	c3, _ := f.node(t, blobs)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c3.Find(cctx, f.alice.AccountID, "once:1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("find with a short deadline: %v", err)
	}
}

// hostileLayer is a sandboxd layer (zstd tar with its manifest) of
// entries written by write, claiming to be the root filesystem of digest.
func hostileLayer(t *testing.T, digest string, write func(tw *tar.Writer)) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "sandboxd-layer",
		PAXRecords: map[string]string{"SANDBOXD.manifest": `{"version":2,"base_image":"oci:` + digest + `","created":"2026-01-01T00:00:00Z"}`}}); err != nil {
		t.Fatal(err)
	}
	write(tw)
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

// TestMaterialiseRefusesHostileBlobs: a blob in the store is not trusted
// more than an image's layer: entries that leave the directory (by name,
// through a symlink it made), a blob of another image, one over the
// limits are refused; nothing is written outside the cache, nothing is
// left in it, and the create fails saying so.
func TestMaterialiseRefusesHostileBlobs(t *testing.T) {
	f, blobs := distributed(t)
	ctx := t.Context()
	outside := t.TempDir()
	reg := func(tw *tar.Writer, name, body string) {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))})
		io.WriteString(tw, body)
	}
	big := strings.Repeat("x", 1<<20)
	for i, c := range []struct {
		name   string
		digest string // "" the template's
		limits oci.Limits
		write  func(tw *tar.Writer)
		words  string
	}{
		{name: "dot-dot", write: func(tw *tar.Writer) { reg(tw, "../../../../"+outside+"/escaped", "x") }, words: "could not be brought to this server"},
		{name: "absolute", write: func(tw *tar.Writer) { reg(tw, outside+"/escaped", "x") }, words: "could not be brought to this server"},
		{name: "through-a-symlink", write: func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "out", Linkname: outside})
			reg(tw, "out/escaped", "x")
		}, words: "could not be brought to this server"},
		{name: "another-image", digest: "sha256:" + strings.Repeat("e", 64), write: func(tw *tar.Writer) { reg(tw, "a", "b") }, words: "could not be brought to this server"},
		{name: "too-large", limits: oci.Limits{MaxBytes: 512 << 10}, write: func(tw *tar.Writer) { reg(tw, "big", big) }, words: "larger than the limit"},
		{name: "too-many-entries", limits: oci.Limits{MaxEntries: 3}, write: func(tw *tar.Writer) {
			for j := range 5 {
				reg(tw, "f"+string(rune('a'+j)), "x")
			}
		}, words: "more than 3 entries"},
	} {
		t.Run(c.name, func(t *testing.T) {
			digest := "sha256:" + strings.Repeat(string(rune('0'+i)), 64)
			claim := digest
			if c.digest != "" {
				claim = c.digest
			}
			info, err := blobs.Put(ctx, bytes.NewReader(hostileLayer(t, claim, c.write)))
			if err != nil {
				t.Fatal(err)
			}
			if err := f.st.PutTemplateImage(ctx, store.TemplateImage{Digest: digest, BlobKey: info.Key, Size: info.Size}); err != nil {
				t.Fatal(err)
			}
			tpl := store.Template{AccountID: f.alice.AccountID, Name: c.name, Tag: "1", Source: "registry.example/x", Status: store.TemplateReady,
				Digest: digest, Config: "{}"}
			if err := f.st.CreateTemplate(ctx, &tpl); err != nil {
				t.Fatal(err)
			}
			cat, dir := f.node(t, blobs, templates.WithLimits(c.limits))
			_, err = cat.Find(ctx, f.alice.AccountID, c.name+":1")
			if err == nil || !strings.Contains(errdefs.Message(err, ""), c.words) {
				t.Fatalf("find: %v; want %q", err, c.words)
			}
			if _, err := os.Lstat(filepath.Join(outside, "escaped")); !os.IsNotExist(err) {
				t.Fatalf("written outside: %v", err)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != ".locks" {
					t.Fatalf("left in the cache: %s", e.Name())
				}
			}
		})
	}

	// An image larger than the disk's free space: refused before a byte
	// is written, saying so.
	info, err := blobs.Put(ctx, bytes.NewReader(hostileLayer(t, "sha256:"+strings.Repeat("d", 64), func(tw *tar.Writer) { reg(tw, "a", "b") })))
	if err != nil {
		t.Fatal(err)
	}
	huge := store.Template{AccountID: f.alice.AccountID, Name: "huge", Tag: "1", Source: "registry.example/x", Status: store.TemplateReady,
		Digest: "sha256:" + strings.Repeat("d", 64), Config: "{}"}
	if err := f.st.CreateTemplate(ctx, &huge); err != nil {
		t.Fatal(err)
	}
	if err := f.st.PutTemplateImage(ctx, store.TemplateImage{Digest: huge.Digest, BlobKey: info.Key, Size: info.Size, Bytes: 1 << 52}); err != nil {
		t.Fatal(err)
	}
	gets := blobs.gets.Load()
	hcat, _ := f.node(t, blobs, templates.WithLimits(oci.Limits{MaxBytes: 1 << 60}))
	_, err = hcat.Find(ctx, f.alice.AccountID, "huge:1")
	if err == nil || !strings.Contains(errdefs.Message(err, ""), "has not the free disk space for the image") || blobs.gets.Load() != gets {
		t.Fatalf("an image larger than the free disk: %v (%d blob reads)", err, blobs.gets.Load()-gets)
	}

	// A template whose image is in no cache and not in the blob store (a
	// build from before): 409 saying so.
	tpl := store.Template{AccountID: f.alice.AccountID, Name: "old", Tag: "1", Source: "registry.example/x", Status: store.TemplateReady,
		Digest: "sha256:" + strings.Repeat("f", 64), Config: "{}"}
	if err := f.st.CreateTemplate(ctx, &tpl); err != nil {
		t.Fatal(err)
	}
	cat, _ := f.node(t, blobs)
	_, err = cat.Find(ctx, f.alice.AccountID, "old:1")
	wantClass(t, "not anywhere", err, errdefs.ErrConflict, "its root filesystem is not in the blob store")
}

// TestDeleteCollectsUnnamedLayers: the delete of a template collects the
// blobs of its layers that nothing names any more (a layer whose cache
// entry a forced rebuild replaced), and keeps those an account's build
// cache or another template still names.
func TestDeleteCollectsUnnamedLayers(t *testing.T) {
	f, blobs := distributed(t)
	ctx := t.Context()
	put := func(s string) string {
		info, err := blobs.Put(ctx, strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return info.Key
	}
	cachedKey, sharedKey, loneKey := put("cached"), put("shared"), put("lone")
	if err := f.st.PutTemplateLayer(ctx, store.TemplateLayer{AccountID: f.alice.AccountID, CacheKey: "k", BlobKey: cachedKey, Size: 6}); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, layers ...string) store.Template {
		tpl := store.Template{AccountID: f.alice.AccountID, Name: name, Tag: "1", Source: "registry.example/x", Status: store.TemplateReady,
			Config: "{}", Layers: `["` + strings.Join(layers, `","`) + `"]`}
		if err := f.st.CreateTemplate(ctx, &tpl); err != nil {
			t.Fatal(err)
		}
		return tpl
	}
	gone := mk("gone", cachedKey, sharedKey, loneKey)
	mk("other", sharedKey)
	if err := f.svc.Delete(ctx, f.alice, gone.ID); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{cachedKey: true, sharedKey: true, loneKey: false} {
		if _, err := blobs.Stat(ctx, key); (err == nil) != want {
			t.Errorf("blob %s: kept %v, want %v", key[:8], err == nil, want)
		}
	}
}

// TestFailedBuildKeepsItsImage: a build that fails in its steps keeps its
// image named (and cached) until the failed template is deleted, so a
// second attempt does not fetch it again; its root filesystem is not
// stored (the build never got ready).
func TestFailedBuildKeepsItsImage(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	host := newFakeHost()
	svc := stepsService(t, f, host, time.Minute)
	ref := f.push(t, "tools/fail:1", v1.Config{}, map[string]string{"a": "b"})
	tpl, err := svc.Build(ctx, f.alice, templates.BuildRequest{Name: "fail:1", Image: ref, Steps: []byte(`[{"type":"RUN","args":["exit 3"]}]`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Run(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := f.st.GetTemplate(ctx, tpl.ID)
	if got.Status != store.TemplateFailed || !strings.HasPrefix(got.Digest, "sha256:") {
		t.Fatalf("failed build: %+v", got)
	}
	if _, err := f.st.GetTemplateImage(ctx, got.Digest); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failed build stored its image: %v", err)
	}
	rootfs := filepath.Join(f.dir, strings.ReplaceAll(got.Digest, ":", "-"))
	svc.Collect(ctx)
	if _, err := os.Stat(rootfs); err != nil {
		t.Fatalf("collected while the failed template names it: %v", err)
	}
	if err := svc.Delete(ctx, f.alice, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rootfs); !os.IsNotExist(err) {
		t.Fatalf("kept after the failed template's delete: %v", err)
	}
}

// TestCollectTheBuildCache: a build cache entry is kept while a template
// names its layer, and after that for CacheKeep since it was made or
// last taken; then Collect deletes it and its layer's blob. A rebuild
// that takes an entry renews it.
func TestCollectTheBuildCache(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	local, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	jc, err := jobs.New(ctx, f.st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	defer jc.Close()
	const keep = time.Second
	svc, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "here", Dir: f.dir, AllowPrivate: true,
		Blobs: local, Host: newFakeHost(), CacheKeep: keep})
	if err != nil {
		t.Fatal(err)
	}
	ref := f.push(t, "tools/cache:1", v1.Config{}, map[string]string{"a": "b"})
	build := func(name string) store.Template {
		t.Helper()
		tpl, err := svc.Build(ctx, f.alice, templates.BuildRequest{Name: name, Image: ref, Steps: []byte(`[{"type":"RUN","args":["echo hi"]}]`)})
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.Run(ctx, tpl.ID); err != nil {
			t.Fatal(err)
		}
		got, _ := f.st.GetTemplate(ctx, tpl.ID)
		if got.Status != store.TemplateReady {
			t.Fatalf("build %s: %+v", name, got)
		}
		return got
	}
	tpl := build("cache:1")
	var layers []string
	if err := json.Unmarshal([]byte(tpl.Layers), &layers); err != nil || len(layers) != 1 {
		t.Fatalf("layers %q %v", tpl.Layers, err)
	}
	stored := func() bool {
		_, err := local.Stat(ctx, layers[0])
		return err == nil
	}
	time.Sleep(keep + 100*time.Millisecond)
	svc.Collect(ctx)
	if !stored() {
		t.Fatal("collected while a template names it")
	}
	// Deleted: the cache entry still names the layer.
	if err := svc.Delete(ctx, f.alice, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if !stored() {
		t.Fatal("the delete collected a layer the build cache names")
	}
	// A rebuild takes it (and renews it): kept through a Collect.
	tpl = build("cache:1")
	if !strings.Contains(tpl.Log, "step 1/1: cached") {
		t.Fatalf("rebuild did not take the cache:\n%s", tpl.Log)
	}
	if err := svc.Delete(ctx, f.alice, tpl.ID); err != nil {
		t.Fatal(err)
	}
	svc.Collect(ctx)
	if !stored() {
		t.Fatal("collected an entry taken less than CacheKeep ago")
	}
	time.Sleep(keep + 100*time.Millisecond)
	svc.Collect(ctx)
	if stored() {
		t.Fatal("an entry unused for longer than CacheKeep, named by no template, was kept")
	}
	// The next build runs its step again.
	tpl = build("cache:1")
	if strings.Contains(tpl.Log, "step 1/1: cached") {
		t.Fatalf("a collected entry was taken:\n%s", tpl.Log)
	}
}

// TestBuildOfADownNodeTakenOver: the build a node declared down was
// running (its row building on that node) is enqueued on the shared
// queue by AdoptBuilds, and another node's worker builds it.
func TestBuildOfADownNodeTakenOver(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	ref := f.push(t, "tools/adopted:1", v1.Config{}, map[string]string{"x": "y"})
	tpl := store.Template{AccountID: f.alice.AccountID, Name: "adopted", Tag: "1", Source: ref, NodeID: "gone"}
	if err := f.st.CreateTemplate(ctx, &tpl); err != nil {
		t.Fatal(err)
	}
	workers := river.NewWorkers()
	jc, err := jobs.New(ctx, f.st, jobs.Config{NodeID: "other", Workers: workers, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "other", Dir: f.dir, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	svc.RegisterWorkers(workers)
	if err := jc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = jc.Stop(context.Background()) })
	// Its own Resume does not take another node's builds.
	if err := svc.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := svc.AdoptBuilds(ctx, "gone"); n != 1 || err != nil {
		t.Fatalf("adopted %d %v", n, err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err := f.st.GetTemplate(ctx, tpl.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == store.TemplateReady {
			break
		}
		if got.Status == store.TemplateFailed || time.Now().After(deadline) {
			t.Fatalf("adopted build: %+v", got)
		}
	}
}

// TestCollectUploads: an uploaded archive is an entry of the build
// cache: checked (HasFiles) it is renewed; unused for CacheKeep it goes
// with its blob, and is then missing.
func TestCollectUploads(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	local, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	jc, err := jobs.New(ctx, f.st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	defer jc.Close()
	const keep = time.Second
	svc, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "here", Dir: f.dir, Blobs: local, Host: newFakeHost(), CacheKeep: keep})
	if err != nil {
		t.Fatal(err)
	}
	archive := gzArchive(t, map[string]string{"a.txt": "a"}, &tar.Header{Typeflag: tar.TypeReg, Name: "a.txt", Mode: 0o644})
	h := hashOf(archive)
	if _, err := svc.PutFiles(ctx, f.alice, h, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(keep + 100*time.Millisecond)
	if _, ok, err := svc.HasFiles(ctx, f.alice, h); !ok || err != nil {
		t.Fatalf("present: %v %v", ok, err)
	}
	svc.Collect(ctx) // just checked: renewed
	if _, ok, _ := svc.HasFiles(ctx, f.alice, h); !ok {
		t.Fatal("an upload checked less than CacheKeep ago was collected")
	}
	time.Sleep(keep + 100*time.Millisecond)
	svc.Collect(ctx)
	if _, ok, _ := svc.HasFiles(ctx, f.alice, h); ok {
		t.Fatal("an upload unused for longer than CacheKeep was kept")
	}
	n := 0
	local.List(ctx, func(blob.Info) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d blobs left", n)
	}
}
