package snapshot_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// allocated is the disk space path really uses.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// duBytes is the space every file under dir uses.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		n += st.Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// state describes everything under dir, directories' times included, so
// a test can tell whether anything there changed.
func state(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("mode=%o uid=%d gid=%d size=%d mtime=%d.%d rdev=%d", st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Rdev)
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			b, _ := os.ReadFile(p)
			out[rel] += " content=" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameState(t *testing.T, before, after map[string]string) bool {
	t.Helper()
	ok := len(before) == len(after)
	for p, b := range before {
		if a := after[p]; a != b {
			t.Errorf("outside the target, %s changed: %s -> %s", p, b, a)
			ok = false
		}
	}
	return ok
}

// layerOf builds a layer by hand, as a hostile sandbox could: entries with
// their contents.
func layerOf(t *testing.T, version int, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "x", PAXRecords: map[string]string{"SANDBOXD.manifest": fmt.Sprintf(`{"version":%d}`, version)}}); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		h := e.h
		h.Format = tar.FormatPAX
		if h.ModTime.IsZero() {
			h.ModTime = time.Unix(1e9, 0)
		}
		h.Size = int64(len(e.data))
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type entry struct {
	h    tar.Header
	data []byte
}

func dirE(name string, mode int64, mt time.Time) entry {
	return entry{h: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode, ModTime: mt}}
}

func fileE(name string, mode int64, data string) entry {
	return entry{h: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, data: []byte(data)}
}

func TestSparseRoundTrip(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "host disk", "a sandbox leaves a 256 MiB sparse file (no blocks) and a 32 MiB file of zeros in its snapshot; restore and flatten",
		"the file comes back 256 MiB long with under 256 KiB of blocks, through capture, apply and flatten within a 16 MiB budget; zeros are written as holes")
	ctx := context.Background()
	src := t.TempDir()
	big := filepath.Join(src, "big.sparse")
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A file with data between holes, and data at its very end.
	mixed := filepath.Join(src, "mixed")
	f, _ = os.Create(mixed)
	f.Truncate(64 << 20)
	f.WriteAt([]byte("middle"), 10<<20)
	f.WriteAt([]byte("end"), 64<<20-3)
	f.Close()
	if a := allocated(t, big); a != 0 {
		t.Fatalf("the test file system does not keep holes: %d bytes allocated", a)
	}

	// The capture fits a 16 MiB budget: holes cost nothing.
	var blob bytes.Buffer
	m, err := snapshot.Write(ctx, &blob, src, snapshot.Manifest{}, snapshot.NewBudget(16<<20))
	if err != nil {
		t.Fatalf("capture of a 256 MiB sparse file with a 16 MiB budget: %v", err)
	}
	if m.Version != snapshot.FormatVersion || blob.Len() > 64<<10 {
		t.Fatalf("layer %+v is %d bytes", m, blob.Len())
	}

	check := func(what, dir string) bool {
		t.Helper()
		ok := true
		for name, size := range map[string]int64{"big.sparse": 256 << 20, "mixed": 64 << 20} {
			p := filepath.Join(dir, name)
			st, err := os.Stat(p)
			if err != nil || st.Size() != size {
				t.Errorf("%s: %s: size %v, %v; want %d", what, name, st, err, size)
				ok = false
				continue
			}
			if a := allocated(t, p); a > 256<<10 {
				t.Errorf("%s: %s came back with %d bytes of real blocks", what, name, a)
				ok = false
			}
		}
		b, _ := os.ReadFile(filepath.Join(dir, "mixed"))
		if len(b) != 64<<20 || string(b[10<<20:10<<20+6]) != "middle" || string(b[len(b)-3:]) != "end" || bytes.Count(b, []byte{0}) != len(b)-9 {
			t.Errorf("%s: mixed's content changed", what)
			ok = false
		}
		return ok
	}
	dst := t.TempDir()
	if _, err := snapshot.Apply(ctx, bytes.NewReader(blob.Bytes()), dst, snapshot.NewBudget(16<<20)); err != nil {
		t.Fatal(err)
	}
	check("apply", dst)

	// Flattening it with a second layer keeps the holes too.
	var flat bytes.Buffer
	two := layerOf(t, 2, fileE("other", 0o644, "x"))
	if _, err := snapshot.Flatten(ctx, &flat, []io.Reader{bytes.NewReader(blob.Bytes()), bytes.NewReader(two)}, t.TempDir(), t.TempDir(), snapshot.Manifest{}, 16<<20); err != nil {
		t.Fatal(err)
	}
	dst2 := t.TempDir()
	if _, err := snapshot.Apply(ctx, &flat, dst2, nil); err != nil {
		t.Fatal(err)
	}
	check("flatten", dst2)

	// A layer that stores zeros (an old version 1 layer, or a hostile one)
	// is written as holes, not as zeros.
	zeros := layerOf(t, 1, fileE("zeros", 0o644, string(make([]byte, 32<<20))))
	dst3 := t.TempDir()
	if _, err := snapshot.Apply(ctx, bytes.NewReader(zeros), dst3, snapshot.NewBudget(1<<20)); err != nil {
		t.Fatalf("apply 32 MiB of zeros with a 1 MiB budget: %v", err)
	}
	if st, err := os.Stat(filepath.Join(dst3, "zeros")); err != nil || st.Size() != 32<<20 || allocated(t, filepath.Join(dst3, "zeros")) != 0 {
		t.Errorf("zeros: %v %v, %d bytes allocated", st, err, allocated(t, filepath.Join(dst3, "zeros")))
	}
}

func TestSizeBound(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "host disk", "a 3 MiB layer is captured, applied and flattened under a 2 MiB sandbox disk limit; a flatten needs more than the host's free space",
		"each is refused with a run error naming the limit, nothing written by the capture, at most the limit unpacked, no scratch left; the free-space check refuses first")
	ctx := context.Background()
	src := t.TempDir()
	rnd := make([]byte, 1<<20)
	for i := range 3 {
		rand.Read(rnd)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint("f", i)), rnd, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// Capture: refused before a byte is written, with the limit named.
	var out bytes.Buffer
	_, err := snapshot.Write(ctx, &out, src, snapshot.Manifest{}, snapshot.NewBudget(2<<20))
	if !errors.Is(err, snapshot.ErrTooLarge) || out.Len() != 0 {
		t.Errorf("capture of 3 MiB with a 2 MiB budget: %v, %d bytes written", err, out.Len())
	}
	if msg := errdefs.Message(err, ""); !strings.Contains(msg, "disk limit of 2 MiB") || strings.Contains(msg, src) {
		t.Errorf("user message %q", msg)
	}

	// Apply: stops at the budget; the target holds no more than it.
	var blob bytes.Buffer
	if _, err := snapshot.Write(ctx, &blob, src, snapshot.Manifest{}, nil); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := snapshot.Apply(ctx, bytes.NewReader(blob.Bytes()), dst, snapshot.NewBudget(2<<20)); !errors.Is(err, snapshot.ErrTooLarge) {
		t.Errorf("apply of 3 MiB with a 2 MiB budget: %v", err)
	}
	if n := duBytes(t, dst); n > 2<<20+64<<10 {
		t.Errorf("the target holds %d bytes after a refused apply", n)
	}

	// Flatten: a chain that adds up past the limit is refused; one that
	// rewrites the same file is not (what is removed is refunded).
	mk := func(name string) []byte {
		rand.Read(rnd)
		return layerOf(t, 2, fileE(name, 0o644, string(rnd)+string(rnd[:512<<10])))
	}
	flatten := func(layers ...[]byte) error {
		rs := make([]io.Reader, len(layers))
		for i, l := range layers {
			rs[i] = bytes.NewReader(l)
		}
		tmp := t.TempDir()
		_, err := snapshot.Flatten(ctx, io.Discard, rs, t.TempDir(), tmp, snapshot.Manifest{}, 2<<20)
		if n := duBytes(t, tmp); n > 8<<10 {
			t.Errorf("flatten left %d bytes of scratch", n)
		}
		return err
	}
	if err := flatten(mk("a"), mk("b")); !errors.Is(err, snapshot.ErrTooLarge) {
		t.Errorf("flatten of 2 x 1.5 MiB with a 2 MiB limit: %v", err)
	}
	if err := flatten(mk("a"), mk("a"), mk("a"), mk("a")); err != nil {
		t.Errorf("flatten of 4 generations of one 1.5 MiB file with a 2 MiB limit: %v", err)
	}
	// And the host must have the room before any scratch work starts.
	if _, err := snapshot.Flatten(ctx, io.Discard, nil, t.TempDir(), t.TempDir(), snapshot.Manifest{}, 1<<60); err == nil || !strings.Contains(errdefs.Message(err, ""), "free disk space") {
		t.Errorf("flatten with a limit past the free space: %v", err)
	}
}

func TestApplyHostileLayers(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name    string
		layer   func(outside string) []byte
		wantErr bool
		check   func(t *testing.T, dst string) bool
	}{
		{name: "dir times through a later symlink", layer: func(outside string) []byte {
			return layerOf(t, 2, dirE("a", 0o755, old), dirE("a/b", 0o755, old), dirE("a/etc", 0o755, old),
				entry{h: tar.Header{Typeflag: tar.TypeSymlink, Name: "a", Linkname: outside}})
		}, check: func(t *testing.T, dst string) bool {
			l, err := os.Readlink(filepath.Join(dst, "a"))
			return err == nil && l != ""
		}},
		{name: "file over a symlink", layer: func(outside string) []byte {
			return layerOf(t, 2, entry{h: tar.Header{Typeflag: tar.TypeSymlink, Name: "f", Linkname: filepath.Join(outside, "victim")}},
				fileE("f", 0o644, "overwritten"))
		}, check: func(t *testing.T, dst string) bool {
			b, err := os.ReadFile(filepath.Join(dst, "f"))
			return err == nil && string(b) == "overwritten"
		}},
		{name: "entry under a symlinked parent", wantErr: true, layer: func(outside string) []byte {
			return layerOf(t, 2, entry{h: tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: outside}}, fileE("l/victim", 0o644, "pwned"))
		}},
		{name: "hard link through a symlinked parent", wantErr: true, layer: func(outside string) []byte {
			return layerOf(t, 2, entry{h: tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: outside}},
				entry{h: tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "l/victim"}})
		}},
		{name: "dotdot paths", wantErr: true, layer: func(outside string) []byte {
			return layerOf(t, 2, fileE("a/../../victim", 0o644, "pwned"))
		}},
		{name: "dotdot hard link", wantErr: true, layer: func(outside string) []byte {
			return layerOf(t, 2, entry{h: tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../victim"}})
		}},
		{name: "device nodes", layer: func(outside string) []byte {
			return layerOf(t, 2,
				entry{h: tar.Header{Typeflag: tar.TypeChar, Name: "mem", Devmajor: 1, Devminor: 1, Mode: 0o666}},
				entry{h: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8, Devminor: 0, Mode: 0o666}},
				entry{h: tar.Header{Typeflag: tar.TypeChar, Name: "whiteout", Mode: 0o000}})
		}, check: func(t *testing.T, dst string) bool {
			_, err1 := os.Lstat(filepath.Join(dst, "mem"))
			_, err2 := os.Lstat(filepath.Join(dst, "sda"))
			var st unix.Stat_t
			err3 := unix.Lstat(filepath.Join(dst, "whiteout"), &st)
			return os.IsNotExist(err1) && os.IsNotExist(err2) && err3 == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
		}},
		{name: "setuid, setgid and capabilities", layer: func(outside string) []byte {
			capFile := fileE("cap", 0o755, "#!/bin/sh\n")
			capFile.h.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\xff\xff\xff\xff\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00"}
			return layerOf(t, 2, fileE("suid", 0o4755, "x"), fileE("sgid", 0o2755, "x"), dirE("shared", 0o2775, old), capFile)
		}, check: func(t *testing.T, dst string) bool {
			ok := true
			for name, want := range map[string]os.FileMode{"suid": 0o755, "sgid": 0o755, "cap": 0o755, "shared": os.ModeDir | os.ModeSetgid | 0o775} {
				st, err := os.Lstat(filepath.Join(dst, name))
				if err != nil || st.Mode() != want {
					t.Errorf("%s: %v %v, want mode %v", name, st.Mode(), err, want)
					ok = false
				}
			}
			if _, err := unix.Lgetxattr(filepath.Join(dst, "cap"), "security.capability", make([]byte, 64)); err == nil {
				t.Errorf("cap kept its file capabilities")
				ok = false
			}
			return ok
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			securitytest.Attack(t, "snapshots", "a hostile layer is restored on the host: "+tc.name,
				"nothing outside the target changes (times, modes, contents); no device node, setuid/setgid file or file capability is created")
			outside := t.TempDir()
			sh(t, outside, "mkdir b etc && echo original > victim && touch -d 2020-02-02 b etc victim .")
			before := state(t, outside)
			dst := filepath.Join(t.TempDir(), "target")
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := snapshot.Apply(ctx, bytes.NewReader(tc.layer(outside)), dst, nil)
			sameState(t, before, state(t, outside))
			if tc.wantErr && !errors.Is(err, snapshot.ErrFormat) {
				t.Errorf("apply: %v, want ErrFormat", err)
			}
			if !tc.wantErr && err != nil {
				t.Errorf("apply: %v", err)
			}
			if tc.check != nil && !tc.check(t, dst) {
				t.Errorf("the target is not what the layer says, safely")
			}
		})
	}
}
