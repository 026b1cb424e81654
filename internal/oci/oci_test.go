package oci_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("SANDBOXD_REQUIRE_RUNTIME") == "1" {
			t.Fatal("oci tests need root (ownership of unpacked files) and SANDBOXD_REQUIRE_RUNTIME=1")
		}
		t.Skip("oci tests need root: unpacking keeps the layers' owners")
	}
}

// ent is one tar entry; Body is a regular file's content.
type ent struct {
	tar.Header
	Body string
}

func file(name, body string, mode int64) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, Body: body}
}

func dir(name string) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}}
}

func symlink(name, target string) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target}}
}

func hardlink(name, target string) ent {
	return ent{Header: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

// layer is a gzip-compressed tar of es, as image builders push them.
func layer(t *testing.T, es ...ent) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range es {
		h := e.Header
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return static.NewLayer(buf.Bytes(), types.OCILayer)
}

// image is an image of layers with cfg, for platform ("os/arch").
func image(t *testing.T, platform string, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, _ = strings.Cut(platform, "/")
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// reg is an in-process registry on loopback.
type reg struct {
	host     string
	requests atomic.Int64
}

// newRegistry serves go-containerregistry's registry on loopback, behind
// wrap if not nil.
func newRegistry(t *testing.T, wrap func(http.Handler) http.Handler) *reg {
	t.Helper()
	r := &reg{}
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	inner := h
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("X-Test-Push") == "" {
			r.requests.Add(1)
			h.ServeHTTP(w, req)
			return
		}
		inner.ServeHTTP(w, req) // the test's own pushes skip the wrapper
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

type pushHeader struct{ http.RoundTripper }

func (p pushHeader) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("X-Test-Push", "1")
	return p.RoundTripper.RoundTrip(req)
}

var pushOpt = remote.WithTransport(pushHeader{http.DefaultTransport})

// push writes img as repo:tag and answers its reference.
func (r *reg) push(t *testing.T, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, pushOpt); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

func (r *reg) pushIndex(t *testing.T, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref, err := name.ParseReference(r.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx, pushOpt); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

// target is a rootfs path under a private (0700) directory.
func target(t *testing.T) string {
	t.Helper()
	parent := t.TempDir()
	if err := os.Chmod(parent, 0o700); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(parent, "rootfs")
}

var private = oci.Options{AllowPrivate: true}

func hostPlatform() string { return "linux/" + runtime.GOARCH }

func TestFetchImage(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	r := newRegistry(t, nil)
	base := layer(t,
		dir("etc/"), dir("bin/"), dir("usr/bin/"), dir("opq/"), dir("opq/sub/"),
		file("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644),
		file("etc/gone", "bye", 0o644),
		file("usr/bin/tool", "#!/bin/sh\necho tool\n", 0o755),
		ent{Header: tar.Header{Typeflag: tar.TypeReg, Name: "home/user/notes", Mode: 0o600, Uid: 1000, Gid: 1001}, Body: "mine"},
		file("usr/bin/sudo", "sudo", 0o4755),
		symlink("bin/tool", "/usr/bin/tool"),
		hardlink("usr/bin/tool-again", "usr/bin/tool"),
		file("opq/old", "old", 0o644), file("opq/sub/old", "old", 0o644),
	)
	upper := layer(t,
		file("etc/.wh.gone", "", 0o644),
		file("opq/new", "new", 0o644),
		file("opq/.wh..wh..opq", "", 0o644),
		ent{Header: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Devmajor: 1, Devminor: 3, Mode: 0o666}},
	)
	top := layer(t, file("./etc/motd", "hello\n", 0o644), file("etc/passwd", "root:x:0:0::/root:/bin/sh\nuser:x:1000:1001::/home/user:/bin/sh\n", 0o644))
	cfg := v1.Config{
		Env:          []string{"PATH=/usr/bin:/bin", "GREETING=hi"},
		WorkingDir:   "/home/user",
		User:         "1000:1001",
		Entrypoint:   []string{"/bin/sh", "-c"},
		Cmd:          []string{"tool"},
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "53/udp": {}},
	}
	img := image(t, hostPlatform(), cfg, base, upper, top)
	ref := r.push(t, "team/app:v1", img)
	want, _ := img.Digest()

	dst := target(t)
	got, err := oci.Fetch(ctx, ref, dst, private)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != want.String() || got.ManifestDigest != want.String() {
		t.Errorf("digests %s %s, want %s", got.Digest, got.ManifestDigest, want)
	}
	if got.Ref != r.host+"/team/app@"+want.String() {
		t.Errorf("pinned ref %q", got.Ref)
	}
	if got.Platform != hostPlatform() || len(got.Layers) != 3 || got.Size <= 0 || got.CompressedSize <= 0 || got.SkippedDevices != 1 {
		t.Errorf("image %+v", got)
	}
	c := got.Config
	if strings.Join(c.Env, ",") != "PATH=/usr/bin:/bin,GREETING=hi" || c.WorkingDir != "/home/user" || c.User != "1000:1001" ||
		strings.Join(c.Entrypoint, " ") != "/bin/sh -c" || strings.Join(c.Cmd, " ") != "tool" || strings.Join(c.ExposedPorts, ",") != "53/udp,8080/tcp" {
		t.Errorf("config %+v", c)
	}

	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(dst, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
		}
		return string(b)
	}
	if !strings.Contains(read("etc/passwd"), "user:x:1000") || read("etc/motd") != "hello\n" || read("opq/new") != "new" {
		t.Error("the top layers' files are not there")
	}
	for _, gone := range []string{"etc/gone", "etc/.wh.gone", "opq/old", "opq/sub", "opq/.wh..wh..opq", "dev/null"} {
		if _, err := os.Lstat(filepath.Join(dst, gone)); !os.IsNotExist(err) {
			t.Errorf("%s is there (%v)", gone, err)
		}
	}
	if l, err := os.Readlink(filepath.Join(dst, "bin/tool")); err != nil || l != "/usr/bin/tool" {
		t.Errorf("symlink: %q %v", l, err)
	}
	var a, b unix.Stat_t
	if unix.Lstat(filepath.Join(dst, "usr/bin/tool"), &a) != nil || unix.Lstat(filepath.Join(dst, "usr/bin/tool-again"), &b) != nil || a.Ino != b.Ino {
		t.Error("the hard link is not a link to the same file")
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dst, "home/user/notes"), &st); err != nil || st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o600 {
		t.Errorf("owner and mode of notes: %d:%d %o %v", st.Uid, st.Gid, st.Mode&0o7777, err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "usr/bin/sudo")); err != nil || fi.Mode() != os.ModeSetuid|0o755 {
		t.Errorf("sudo keeps its setuid bit: %v %v", fi.Mode(), err)
	}

	// The pinned reference gets the same image, whatever the tag does next.
	r.push(t, "team/app:v1", image(t, hostPlatform(), cfg, top))
	again, err := oci.Resolve(ctx, got.Ref, private)
	if err != nil || again.ManifestDigest != got.ManifestDigest || len(again.Layers) != 3 {
		t.Errorf("resolve the pinned ref: %+v %v", again, err)
	}
	moved, err := oci.Resolve(ctx, ref, private)
	if err != nil || moved.ManifestDigest == got.ManifestDigest {
		t.Errorf("resolve the moved tag: %+v %v", moved, err)
	}
}

func TestFetchIndex(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	r := newRegistry(t, nil)
	var adds []mutate.IndexAddendum
	for _, arch := range []string{"amd64", "arm64", "riscv64"} {
		img := image(t, "linux/"+arch, v1.Config{Env: []string{"ARCH=" + arch}}, layer(t, file("arch", arch, 0o644)))
		p := &v1.Platform{OS: "linux", Architecture: arch}
		if arch == "arm64" {
			p.Variant = "v8"
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: p}})
	}
	idx := mutate.AppendManifests(empty.Index, adds...)
	ref := r.pushIndex(t, "multi:latest", idx)
	idxDigest, _ := idx.Digest()

	check := func(platform, wantArch string) {
		t.Helper()
		opts := private
		opts.Platform = platform
		dst := target(t)
		got, err := oci.Fetch(ctx, ref, dst, opts)
		if err != nil {
			t.Fatalf("%s: %v", platform, err)
		}
		b, _ := os.ReadFile(filepath.Join(dst, "arch"))
		if string(b) != wantArch || got.Config.Env[0] != "ARCH="+wantArch || got.Digest != idxDigest.String() || got.ManifestDigest == got.Digest {
			t.Errorf("%s: got %q, %+v", platform, b, got)
		}
	}
	if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" {
		check("", runtime.GOARCH)
	}
	check("linux/arm64", "arm64")
	check("linux/riscv64", "riscv64")

	opts := private
	opts.Platform = "linux/s390x"
	dst := target(t)
	_, err := oci.Fetch(ctx, ref, dst, opts)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "no variant for linux/s390x") {
		t.Errorf("an index without the platform: %v", err)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Errorf("the target exists after a failed fetch")
	}
}

func TestPlatformOfASingleImage(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	r := newRegistry(t, nil)
	other := "riscv64"
	if runtime.GOARCH == other {
		other = "arm64"
	}
	ref := r.push(t, "foreign:1", image(t, "linux/"+other, v1.Config{}, layer(t, file("a", "a", 0o644))))
	_, err := oci.Fetch(ctx, ref, target(t), private)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "is for linux/"+other+", not linux/") {
		t.Errorf("an image for another architecture: %v", err)
	}
	opts := private
	opts.Platform = "linux/" + other
	if _, err := oci.Fetch(ctx, ref, target(t), opts); err != nil {
		t.Errorf("asked for its platform: %v", err)
	}
}

func TestHostileLayers(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	r := newRegistry(t, nil)
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	cases := []struct {
		name   string
		layers func() []v1.Layer
	}{
		{"dotdot", func() []v1.Layer { return []v1.Layer{layer(t, file("../x", "pwned", 0o644))} }},
		{"dotdot deep", func() []v1.Layer { return []v1.Layer{layer(t, file("a/../../x", "pwned", 0o644))} }},
		{"absolute name", func() []v1.Layer { return []v1.Layer{layer(t, file(victim, "pwned", 0o644))} }},
		{"hard link outside", func() []v1.Layer {
			return []v1.Layer{layer(t, hardlink("h", "../../../../../../"+strings.TrimPrefix(victim, "/")))}
		}},
		{"absolute hard link", func() []v1.Layer { return []v1.Layer{layer(t, hardlink("h", victim))} }},
		{"write through a symlink", func() []v1.Layer {
			return []v1.Layer{layer(t, symlink("l", outside), file("l/victim", "pwned", 0o644))}
		}},
		{"write through a lower layer's symlink", func() []v1.Layer {
			return []v1.Layer{layer(t, symlink("l", outside)), layer(t, file("l/victim", "pwned", 0o644))}
		}},
		{"whiteout through a symlink", func() []v1.Layer {
			return []v1.Layer{layer(t, symlink("l", outside)), layer(t, file("l/.wh.victim", "", 0o644))}
		}},
		{"opaque through a symlink", func() []v1.Layer {
			return []v1.Layer{layer(t, symlink("l", outside)), layer(t, file("l/.wh..wh..opq", "", 0o644))}
		}},
		{"hard link through a symlink", func() []v1.Layer {
			return []v1.Layer{layer(t, symlink("l", outside), hardlink("h", "l/victim"))}
		}},
		{"whiteout of dotdot", func() []v1.Layer { return []v1.Layer{layer(t, file("a/.wh..", "", 0o644))} }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			securitytest.Attack(t, "images", "an image's layer escapes the rootfs while it is unpacked on the host: "+tc.name,
				"refused with a 400-class error naming the entry; nothing outside the rootfs changes; the partial rootfs is removed")
			if err := os.WriteFile(victim, []byte("original"), 0o644); err != nil {
				t.Fatal(err)
			}
			ref := r.push(t, fmt.Sprintf("hostile:%d", i), image(t, hostPlatform(), v1.Config{}, tc.layers()...))
			dst := target(t)
			_, err := oci.Fetch(ctx, ref, dst, private)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "cannot be unpacked safely") {
				t.Errorf("fetch: %v, want ErrInvalid", err)
			}
			if b, err := os.ReadFile(victim); err != nil || string(b) != "original" {
				t.Errorf("the victim outside changed: %q %v", b, err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 1 {
				t.Errorf("something was created outside: %v", ents)
			}
			if _, err := os.Lstat(dst); !os.IsNotExist(err) {
				t.Errorf("the target exists after a failed fetch")
			}
		})
	}
}

// bomb is a gzip stream of a tar holding one file of n MiB of zeros,
// made of concatenated gzip members so that building it costs little:
// about 1 KiB per MiB.
func bomb(t *testing.T, n int) v1.Layer {
	t.Helper()
	member := func(b []byte) []byte {
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		return buf.Bytes()
	}
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Mode: 0o644, Size: int64(n) << 20}); err != nil {
		t.Fatal(err)
	}
	mib := member(make([]byte, 1<<20))
	blob := bytes.NewBuffer(member(hdr.Bytes()))
	for range n {
		blob.Write(mib)
	}
	blob.Write(member(make([]byte, 1024))) // the tar's end
	return static.NewLayer(blob.Bytes(), types.OCILayer)
}

// countBlob counts the bytes a registry sends of blob responses.
type countBlob struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c countBlob) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}

func TestDecompressionBomb(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "images", "a 32 MiB layer that gunzips to 32 GiB (a decompression bomb) is pulled under an 8 MiB limit",
		"refused with ErrTooLarge naming the limit once 8 MiB are decompressed, most of the blob never read, the partial rootfs removed")
	ctx := context.Background()
	var sent atomic.Int64
	r := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if strings.Contains(req.URL.Path, "/blobs/") && req.Method == http.MethodGet {
				w = countBlob{w, &sent}
			}
			h.ServeHTTP(w, req)
		})
	})
	const gib = 32
	l := bomb(t, gib<<10) // 32 GiB of zeros in about 32 MiB
	size, _ := l.Size()
	ref := r.push(t, "bomb:1", image(t, hostPlatform(), v1.Config{}, l))
	opts := private
	opts.Limits.MaxBytes = 8 << 20
	dst := target(t)
	_, err := oci.Fetch(ctx, ref, dst, opts)
	if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(errdefs.Message(err, ""), "limit of 8 MiB uncompressed") {
		t.Fatalf("fetch of a %d GiB bomb under an 8 MiB limit: %v", gib, err)
	}
	// Stopped at the bound: a fraction of the blob was read (what the
	// socket buffers held besides), none of the rest decompressed.
	t.Logf("sent %d of %d", sent.Load(), size)
	if n := sent.Load(); n > size/2 {
		t.Errorf("the registry sent %d of the bomb's %d bytes", n, size)
	}
	if _, err := os.Lstat(dst); !os.IsNotExist(err) {
		t.Errorf("the target exists after a failed fetch")
	}
}

func TestLimits(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "images", "an image over the layer count, layer size, entry count or uncompressed size limit is pulled",
		"refused with ErrTooLarge naming the limit (from the manifest alone when it tells), the partial rootfs removed")
	ctx := context.Background()
	r := newRegistry(t, nil)
	three := r.push(t, "three:1", image(t, hostPlatform(), v1.Config{},
		layer(t, file("a", "a", 0o644), file("b", "b", 0o644)),
		layer(t, file("c", strings.Repeat("c", 4096), 0o644), file("d", "d", 0o644)),
		layer(t, file("e", "e", 0o644))))
	cases := []struct {
		name string
		lim  oci.Limits
		want string
	}{
		{"layers", oci.Limits{MaxLayers: 2}, "3 layers, more than the limit of 2"},
		{"layer bytes", oci.Limits{MaxLayerBytes: 50}, "layer 1 of image " + three + " is larger than the limit of 50 bytes compressed"},
		{"entries", oci.Limits{MaxEntries: 3}, "more than the limit of 3 files"},
		{"entries, exactly used up", oci.Limits{MaxEntries: 4}, "more than the limit of 4 files"},
		{"bytes", oci.Limits{MaxBytes: 4096}, "limit of 4 KiB uncompressed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := r.requests.Load()
			opts := private
			opts.Limits = tc.lim
			dst := target(t)
			_, err := oci.Fetch(ctx, three, dst, opts)
			if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(errdefs.Message(err, ""), tc.want) {
				t.Errorf("fetch: %v, want ErrTooLarge and %q", err, tc.want)
			}
			if _, err := os.Lstat(dst); !os.IsNotExist(err) {
				t.Errorf("the target exists after a failed fetch")
			}
			t.Logf("%d requests", r.requests.Load()-before)
		})
	}
	// Exactly at the limits is fine.
	opts := private
	opts.Limits = oci.Limits{MaxLayers: 3, MaxEntries: 5}
	if _, err := oci.Fetch(ctx, three, target(t), opts); err != nil {
		t.Errorf("fetch at the limits: %v", err)
	}
}

// staticResolver answers every name with addrs.
type staticResolver []netip.Addr

func (s staticResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return s, nil
}

func TestPrivateRegistryRefused(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "images", "an image is pulled from a registry on loopback (an address, a name resolving to it) or a metadata endpoint",
		"refused without AllowPrivate (metadata always) before a request reaches it, the name checked at the address dialled")
	ctx := context.Background()
	r := newRegistry(t, nil)
	ref := r.push(t, "app:1", image(t, hostPlatform(), v1.Config{}, layer(t, file("a", "a", 0o644))))
	_, port, _ := strings.Cut(r.host, ":")
	cases := map[string]struct {
		ref  string
		opts oci.Options
	}{
		"loopback address": {ref: ref},
		// A name that resolves to loopback: refused where it is dialled,
		// so a second answer (DNS rebinding) cannot differ from the one
		// checked.
		"name resolving to loopback": {ref: "registry.test:" + port + "/app:1", opts: oci.Options{Insecure: true, Resolver: staticResolver{netip.MustParseAddr("127.0.0.1")}}},
		"metadata even when allowed": {ref: "169.254.169.254/app:1", opts: oci.Options{AllowPrivate: true}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			before := r.requests.Load()
			dst := target(t)
			_, err := oci.Fetch(ctx, tc.ref, dst, tc.opts)
			if !errors.Is(err, errdefs.ErrInvalid) || !errors.Is(err, fetch.ErrAddressNotAllowed) || !strings.Contains(errdefs.Message(err, ""), "which this server does not connect to") {
				t.Errorf("fetch: %v, want a refused address", err)
			}
			if n := r.requests.Load() - before; n != 0 {
				t.Errorf("the registry got %d requests", n)
			}
		})
	}
}

// basicAuth lets through requests with user and password, and answers
// others 401 with what they sent in the body, as a careless (or hostile)
// registry could.
func basicAuth(user, password string) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			u, p, ok := req.BasicAuth()
			if !ok || u != user || p != password {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials %s:%s (%s)"}]}`, u, p, req.Header.Get("Authorization"))
				return
			}
			h.ServeHTTP(w, req)
		})
	}
}

func TestBasicAuth(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "images", "a registry behind basic auth echoes the credentials it was sent into its error",
		"anonymous and wrong credentials are refused; the password (and its base64) never appear in the error")
	ctx := context.Background()
	r := newRegistry(t, basicAuth("alice", "correct-horse-battery"))
	ref := r.push(t, "private/app:1", image(t, hostPlatform(), v1.Config{}, layer(t, file("a", "a", 0o644))))

	opts := private
	if _, err := oci.Fetch(ctx, ref, target(t), opts); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "needs credentials") {
		t.Errorf("anonymous: %v", err)
	}
	const wrong = "wrong-secret-1234"
	opts.Credentials = oci.Credentials{Username: "alice", Password: wrong}
	_, err := oci.Fetch(ctx, ref, target(t), opts)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "refused the credentials") {
		t.Errorf("wrong password: %v", err)
	}
	if err != nil && (strings.Contains(err.Error(), wrong) || strings.Contains(fmt.Sprintf("%+v %#v", err, err), wrong) || strings.Contains(err.Error(), "YWxpY2U6d3Jvbmc")) {
		t.Errorf("the error shows the password: %v", err)
	}
	if err != nil && !strings.Contains(err.Error(), "[redacted]") {
		t.Errorf("the registry echoed the password, the error should say it was redacted: %v", err)
	}

	opts.Credentials.Password = "correct-horse-battery"
	dst := target(t)
	if _, err := oci.Fetch(ctx, ref, dst, opts); err != nil {
		t.Fatalf("with the right password: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a")); string(b) != "a" {
		t.Error("the image is not unpacked")
	}
}

// bearerOnly lets through requests with the bearer token and challenges
// others, echoing what they sent.
func bearerOnly(token string) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if req.URL.Path == "/token" {
				// The token service: an identity (refresh) token for
				// the access token, nothing else.
				if req.Method == http.MethodPost && req.ParseForm() == nil && req.PostForm.Get("grant_type") == "refresh_token" && req.PostForm.Get("refresh_token") == "id-"+token {
					fmt.Fprintf(w, `{"access_token":%q}`, token)
					return
				}
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"errors":[{"code":"UNAUTHORIZED","message":"bad refresh token %q"}]}`, req.PostForm.Get("refresh_token"))
				return
			}
			if req.Header.Get("Authorization") != "Bearer "+token {
				w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+req.Host+`/token",service="test"`)
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"errors":[{"code":"UNAUTHORIZED","message":"got %q"}]}`, req.Header.Get("Authorization"))
				return
			}
			h.ServeHTTP(w, req)
		})
	}
}

func TestRegistryToken(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	r := newRegistry(t, bearerOnly("tok-good-5678"))
	ref := r.push(t, "private/app:1", image(t, hostPlatform(), v1.Config{}, layer(t, file("a", "a", 0o644))))
	opts := private
	opts.Credentials = oci.Credentials{RegistryToken: "tok-good-5678"}
	if _, err := oci.Fetch(ctx, ref, target(t), opts); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	opts.Credentials = oci.Credentials{RegistryToken: "tok-bad-9999"}
	_, err := oci.Fetch(ctx, ref, target(t), opts)
	if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(fmt.Sprint(err), "tok-bad-9999") {
		t.Errorf("a wrong token: %v", err)
	}

	// An identity token is exchanged at the token service first.
	opts.Credentials = oci.Credentials{IdentityToken: "id-tok-good-5678"}
	if _, err := oci.Fetch(ctx, ref, target(t), opts); err != nil {
		t.Fatalf("with the identity token: %v", err)
	}
	opts.Credentials = oci.Credentials{IdentityToken: "id-bad-4321"}
	_, err = oci.Fetch(ctx, ref, target(t), opts)
	if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(fmt.Sprint(err), "id-bad-4321") {
		t.Errorf("a wrong identity token: %v", err)
	}
}

func TestCredentialsNeverPrinted(t *testing.T) {
	c := oci.Credentials{Username: "alice", Password: "pw-secret", IdentityToken: "id-secret", RegistryToken: "reg-secret"}
	var logs bytes.Buffer
	logger := log.New(&logs, "", 0)
	logger.Printf("%v %+v %#v %s %q", c, c, c, c, c)
	logger.Print(c)
	opts := oci.Options{Credentials: c}
	logger.Printf("%v %+v %#v", opts, opts, opts)
	out := logs.String()
	for _, s := range []string{"pw-secret", "id-secret", "reg-secret"} {
		if strings.Contains(out, s) {
			t.Errorf("printed: %s", out)
		}
	}
	if !strings.Contains(out, "username=alice password=[redacted]") {
		t.Errorf("printed: %s", out)
	}
}

func TestSetIDPolicy(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "images", "an image with setuid and setgid files is unpacked where other host users could reach it",
		"refused unless the rootfs's parent is 0700 and the caller's; with DropSetID the bits are dropped")
	ctx := context.Background()
	r := newRegistry(t, nil)
	ref := r.push(t, "suid:1", image(t, hostPlatform(), v1.Config{}, layer(t, file("sudo", "x", 0o4755), file("wall", "x", 0o2755))))

	// A parent other users can search: refused before anything is pulled.
	open := t.TempDir()
	if err := os.Chmod(open, 0o755); err != nil {
		t.Fatal(err)
	}
	before := r.requests.Load()
	if _, err := oci.Fetch(ctx, ref, filepath.Join(open, "rootfs"), private); !errors.Is(err, oci.ErrNotPrivate) {
		t.Errorf("fetch under a 0755 directory: %v", err)
	}
	if r.requests.Load() != before {
		t.Error("the registry was asked before the target was checked")
	}
	// DropSetID: allowed there, without the bits.
	opts := private
	opts.DropSetID = true
	dst := filepath.Join(open, "rootfs")
	if _, err := oci.Fetch(ctx, ref, dst, opts); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"sudo", "wall"} {
		if fi, err := os.Lstat(filepath.Join(dst, n)); err != nil || fi.Mode() != 0o755 {
			t.Errorf("%s: %v %v, want 0755", n, fi.Mode(), err)
		}
	}
}
