package snapshot_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// plainTar is an uncompressed tar of hs; regular files get their Size in
// bytes of "x" unless body is set.
func plainTar(t *testing.T, hs ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hs {
		if h.Typeflag == tar.TypeReg && h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func exists(dir, rel string) bool {
	_, err := os.Lstat(filepath.Join(dir, rel))
	return err == nil
}

func TestApplyTarOCIWhiteouts(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	dst := t.TempDir()
	oci := snapshot.TarOptions{Whiteouts: snapshot.OCIWhiteouts}
	lower := plainTar(t,
		tar.Header{Typeflag: tar.TypeDir, Name: "./etc/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "./etc/gone", Size: 1},
		tar.Header{Typeflag: tar.TypeReg, Name: "./etc/kept", Size: 1},
		tar.Header{Typeflag: tar.TypeDir, Name: "opq/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "opq/old", Size: 1},
		tar.Header{Typeflag: tar.TypeDir, Name: "opq/sub/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "opq/sub/old", Size: 1},
		tar.Header{Typeflag: tar.TypeDir, Name: "tree/a/b/", Mode: 0o755},
		tar.Header{Typeflag: tar.TypeReg, Name: "tree/a/b/c", Size: 1},
	)
	// The opaque marker comes after this layer's own entries in opq:
	// those stay, what lower layers had there goes.
	upper := plainTar(t,
		tar.Header{Typeflag: tar.TypeReg, Name: "etc/.wh.gone"},
		tar.Header{Typeflag: tar.TypeReg, Name: "opq/new", Size: 1},
		tar.Header{Typeflag: tar.TypeReg, Name: "opq/sub/new", Size: 1},
		tar.Header{Typeflag: tar.TypeReg, Name: "opq/.wh..wh..opq"},
		tar.Header{Typeflag: tar.TypeReg, Name: ".wh.tree"},
		tar.Header{Typeflag: tar.TypeReg, Name: ".wh.never-there"},
	)
	if _, err := snapshot.ApplyTar(ctx, bytes.NewReader(lower), dst, oci); err != nil {
		t.Fatal(err)
	}
	st, err := snapshot.ApplyTar(ctx, bytes.NewReader(upper), dst, oci)
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != 6 || st.Whiteouts != 4 {
		t.Errorf("stats %+v, want 6 entries, 4 whiteouts", st)
	}
	for rel, want := range map[string]bool{
		"etc/gone": false, "etc/kept": true, "etc/.wh.gone": false,
		"opq/old": false, "opq/new": true, "opq/sub/old": false, "opq/sub/new": true, "opq/.wh..wh..opq": false,
		"tree": false, ".wh.tree": false,
	} {
		if exists(dst, rel) != want {
			t.Errorf("%s exists: %v, want %v", rel, !want, want)
		}
	}
}

func TestApplyTarOCIPolicy(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	layer := plainTar(t,
		tar.Header{Typeflag: tar.TypeReg, Name: "sudo", Mode: 0o4755, Size: 1},
		tar.Header{Typeflag: tar.TypeReg, Name: "wall", Mode: 0o2755, Size: 1},
		tar.Header{Typeflag: tar.TypeReg, Name: "ping", Mode: 0o755, Size: 1, PAXRecords: map[string]string{
			"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}},
		tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3, Mode: 0o666},
		tar.Header{Typeflag: tar.TypeChar, Name: "whiteout-like", Mode: 0o666},
		tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8, Mode: 0o666},
		tar.Header{Typeflag: tar.TypeLink, Name: "null2", Linkname: "./null"},
		tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o600},
		tar.Header{Typeflag: tar.TypeDir, Name: "d", Mode: 0o755, PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}},
	)
	for _, keep := range []bool{true, false} {
		dst := t.TempDir()
		st, err := snapshot.ApplyTar(ctx, bytes.NewReader(layer), dst, snapshot.TarOptions{Whiteouts: snapshot.OCIWhiteouts, KeepSetID: keep})
		if err != nil {
			t.Fatal(err)
		}
		if st.Devices != 4 {
			t.Errorf("devices skipped: %d, want 4", st.Devices)
		}
		for _, n := range []string{"null", "whiteout-like", "sda", "null2"} {
			if exists(dst, n) {
				t.Errorf("device node %s was created", n)
			}
		}
		if fi, err := os.Lstat(filepath.Join(dst, "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
			t.Errorf("fifo: %v %v", fi, err)
		}
		if _, err := os.Lstat(filepath.Join(dst, "d")); err != nil {
			t.Error(err)
		}
		want := map[string]os.FileMode{"sudo": 0o755, "wall": 0o755}
		if keep {
			want = map[string]os.FileMode{"sudo": os.ModeSetuid | 0o755, "wall": os.ModeSetgid | 0o755}
		}
		_, err = unix.Lgetxattr(filepath.Join(dst, "ping"), "security.capability", make([]byte, 64))
		if (err == nil) != keep {
			t.Errorf("keep=%v: ping's file capability: %v", keep, err)
		}
		for n, m := range want {
			if fi, err := os.Lstat(filepath.Join(dst, n)); err != nil || fi.Mode() != m {
				t.Errorf("keep=%v: %s mode %v (%v), want %v", keep, n, fi.Mode(), err, m)
			}
		}
	}
}

func TestApplyTarOCIRefusals(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	oci := snapshot.TarOptions{Whiteouts: snapshot.OCIWhiteouts}
	outside := t.TempDir()
	cases := map[string][]byte{
		"dotdot":             plainTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "../x", Size: 1}),
		"dot slash dotdot":   plainTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "./../x", Size: 1}),
		"absolute":           plainTar(t, tar.Header{Typeflag: tar.TypeReg, Name: outside + "/x", Size: 1}),
		"whiteout of dotdot": plainTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "a/.wh.."}),
		"hard link out":      plainTar(t, tar.Header{Typeflag: tar.TypeLink, Name: "h", Linkname: "../x"}),
		"through symlink": plainTar(t, tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: outside},
			tar.Header{Typeflag: tar.TypeReg, Name: "l/x", Size: 1}),
		"whiteout through symlink": plainTar(t, tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: outside},
			tar.Header{Typeflag: tar.TypeReg, Name: "l/.wh.victim"}),
		"opaque through symlink": plainTar(t, tar.Header{Typeflag: tar.TypeSymlink, Name: "l", Linkname: outside},
			tar.Header{Typeflag: tar.TypeReg, Name: "l/.wh..wh..opq"}),
	}
	for name, layer := range cases {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("v"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := snapshot.ApplyTar(ctx, bytes.NewReader(layer), t.TempDir(), oci)
			if !errors.Is(err, snapshot.ErrFormat) {
				t.Errorf("apply: %v, want ErrFormat", err)
			}
			if exists(outside, "x") || !exists(outside, "victim") {
				t.Errorf("the layer reached outside the target")
			}
		})
	}
	many := plainTar(t, tar.Header{Typeflag: tar.TypeReg, Name: "a"}, tar.Header{Typeflag: tar.TypeReg, Name: "b"}, tar.Header{Typeflag: tar.TypeReg, Name: "c"})
	_, err := snapshot.ApplyTar(ctx, bytes.NewReader(many), t.TempDir(), snapshot.TarOptions{Whiteouts: snapshot.OCIWhiteouts, MaxEntries: 2})
	if !errors.Is(err, snapshot.ErrTooManyEntries) {
		t.Errorf("3 entries with MaxEntries 2: %v", err)
	}
}
