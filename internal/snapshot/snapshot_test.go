package snapshot_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/snapshot"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("SANDBOXD_REQUIRE_RUNTIME") == "1" {
			t.Fatal("snapshot tests need root (overlay mounts, whiteouts) and SANDBOXD_REQUIRE_RUNTIME=1")
		}
		t.Skip("snapshot tests need root: they mount overlayfs and create whiteouts")
	}
}

// overlay mounts lowers (top first) and upper at a fresh directory and
// unmounts it when the test ends.
func overlay(t *testing.T, upper string, lowers ...string) string {
	t.Helper()
	dir := t.TempDir()
	work, merged := filepath.Join(dir, "work"), filepath.Join(dir, "merged")
	for _, d := range []string{work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,redirect_dir=off", strings.Join(lowers, ":"), upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

func unmount(t *testing.T, merged string) {
	t.Helper()
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
}

func sh(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-ec", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
}

// tree describes a merged view: type, mode, owner, content hash, link
// target and user xattrs per path.
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode=%o uid=%d", st.Mode, st.Uid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" sha=%x nlink=%d", sha256.Sum256(b), st.Nlink)
			if rel != "." {
				desc += fmt.Sprintf(" mtime=%d", st.Mtim.Sec)
			}
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		}
		if v := make([]byte, 64); true {
			if n, err := unix.Lgetxattr(p, "user.note", v); err == nil {
				desc += " user.note=" + string(v[:n])
			}
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffTrees(t *testing.T, want, got map[string]string) {
	t.Helper()
	for p, w := range want {
		if g, ok := got[p]; !ok {
			t.Errorf("missing %s (%s)", p, w)
		} else if g != w {
			t.Errorf("%s: got %s, want %s", p, g, w)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected %s (%s)", p, g)
		}
	}
}

func writeLayer(t *testing.T, dir string, m snapshot.Manifest) ([]byte, snapshot.Manifest) {
	t.Helper()
	var buf bytes.Buffer
	m, err := snapshot.Write(context.Background(), &buf, dir, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, n, err := snapshot.Digest(bytes.NewReader(buf.Bytes()))
	if err != nil || id != m.ID || n != m.Size {
		t.Fatalf("digest %s/%d, manifest %s/%d (%v)", id, n, m.ID, m.Size, err)
	}
	return buf.Bytes(), m
}

func TestSnapshotRestoreChainFlatten(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	sh(t, base, `
		echo base-a > a.txt
		mkdir -p dir1 dir2/sub etc
		echo x > dir1/x; echo y > dir1/y; echo z > dir2/z; echo s > dir2/sub/s
		echo keep > etc/keep
		ln -s etc bin-link`)

	// Generation 1: changes everywhere, including deletions and a directory
	// replaced wholesale (which overlayfs records as an opaque directory).
	up1 := t.TempDir()
	m1 := overlay(t, up1, base)
	sh(t, m1, `
		echo changed > a.txt
		rm dir1/x
		rm -rf dir2 && mkdir dir2 && echo fresh > dir2/n
		mkdir -p new/deep && echo deep > new/deep/f.txt
		echo linked > new/h1 && ln new/h1 new/h2
		ln -s ../a.txt new/sym
		mkfifo new/fifo
		echo suid > new/suid && chmod 4755 new/suid
		chown 1000:1000 new/deep/f.txt
		truncate -s 3M new/sparse`)
	if err := unix.Lsetxattr(filepath.Join(m1, "new/deep/f.txt"), "user.note", []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	want1 := tree(t, m1)
	unmount(t, m1)
	// Layers are untrusted: a restore drops the setuid bit.
	if !strings.Contains(want1["new/suid"], "mode=104755") {
		t.Fatalf("setuid file: %s", want1["new/suid"])
	}
	want1["new/suid"] = strings.Replace(want1["new/suid"], "mode=104755", "mode=100755", 1)
	if v := make([]byte, 1); true {
		if n, err := unix.Lgetxattr(filepath.Join(up1, "dir2"), snapshot.OpaqueXattr, v); err != nil || n != 1 || v[0] != 'y' {
			t.Fatalf("overlayfs did not make dir2 opaque (%v): the test does not cover opaque directories", err)
		}
	}
	if !strings.Contains(want1["new/deep/f.txt"], "user.note=hello") {
		t.Fatalf("xattr not visible: %s", want1["new/deep/f.txt"])
	}

	blob1, man1 := writeLayer(t, up1, snapshot.Manifest{BaseImage: "img-1"})
	if man1.Whiteouts == 0 {
		t.Fatalf("manifest %+v: no whiteouts recorded for the deletion", man1)
	}
	got, err := snapshot.ReadManifest(bytes.NewReader(blob1))
	if err != nil || got.BaseImage != "img-1" || got.Entries != man1.Entries || got.Whiteouts != man1.Whiteouts {
		t.Fatalf("ReadManifest %+v %v, want %+v", got, err, man1)
	}

	// Restore generation 1 into a fresh upper and compare the merged view.
	up1r := t.TempDir()
	if _, err := snapshot.Apply(context.Background(), bytes.NewReader(blob1), up1r, nil); err != nil {
		t.Fatal(err)
	}
	diffTrees(t, want1, tree(t, overlay(t, up1r, base)))

	// Generation 2 on top of generation 1 as a read-only lower: its upper
	// holds only the difference.
	l1 := t.TempDir()
	if _, err := snapshot.Apply(context.Background(), bytes.NewReader(blob1), l1, nil); err != nil {
		t.Fatal(err)
	}
	up2 := t.TempDir()
	m2 := overlay(t, up2, l1, base)
	sh(t, m2, `
		rm new/deep/f.txt
		rm -rf dir1
		echo again > dir1-new
		echo v2 > a.txt
		rm etc/keep`)
	want2 := tree(t, m2)
	unmount(t, m2)
	blob2, man2 := writeLayer(t, up2, snapshot.Manifest{Parent: man1.ID, BaseImage: "img-1"})
	if man2.Parent != man1.ID {
		t.Fatalf("parent %q", man2.Parent)
	}

	// The chain restored as read-only lowers (how a runtime restores it),
	// and its flattened form restored as one layer, both show generation 2.
	l2 := t.TempDir()
	if _, err := snapshot.Apply(context.Background(), bytes.NewReader(blob2), l2, nil); err != nil {
		t.Fatal(err)
	}
	diffTrees(t, want2, tree(t, overlay(t, t.TempDir(), l2, l1, base)))

	var flat bytes.Buffer
	fm, err := snapshot.Flatten(context.Background(), &flat, []io.Reader{bytes.NewReader(blob1), bytes.NewReader(blob2)}, base, t.TempDir(), snapshot.Manifest{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fm.BaseImage != "img-1" || fm.Parent != "" || fm.ID == man2.ID {
		t.Fatalf("flattened manifest %+v", fm)
	}
	flatUp := t.TempDir()
	if _, err := snapshot.Apply(context.Background(), &flat, flatUp, nil); err != nil {
		t.Fatal(err)
	}
	diffTrees(t, want2, tree(t, overlay(t, flatUp, base)))
}

// evilLayer builds a layer by hand, as a hostile sandbox could.
func evilLayer(t *testing.T, entries []tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "x", PAXRecords: map[string]string{"SANDBOXD.manifest": `{"version":1}`}}); err != nil {
		t.Fatal(err)
	}
	for _, h := range entries {
		h := h
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte("p"), int(h.Size)))
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func TestApplyRefusesEscapes(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	cases := []struct {
		name    string
		entries []tar.Header
	}{
		{"dotdot", []tar.Header{{Typeflag: tar.TypeReg, Name: "../pwned", Size: 1, Mode: 0o644}}},
		{"absolute", []tar.Header{{Typeflag: tar.TypeReg, Name: outside + "/pwned", Size: 1, Mode: 0o644}}},
		{"through symlink", []tar.Header{
			{Typeflag: tar.TypeSymlink, Name: "evil", Linkname: outside},
			{Typeflag: tar.TypeReg, Name: "evil/pwned", Size: 1, Mode: 0o644},
		}},
		{"hard link out", []tar.Header{{Typeflag: tar.TypeLink, Name: "h", Linkname: "../../etc/passwd"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dst := t.TempDir()
			_, err := snapshot.Apply(context.Background(), bytes.NewReader(evilLayer(t, tc.entries)), dst, nil)
			if !errors.Is(err, snapshot.ErrFormat) {
				t.Errorf("apply: %v, want ErrFormat", err)
			}
			if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
				t.Fatal("an entry escaped the target directory")
			}
		})
	}
}

func TestNotALayer(t *testing.T) {
	for _, b := range [][]byte{nil, []byte("garbage"), evilLayerNoManifest(t)} {
		if _, err := snapshot.ReadManifest(bytes.NewReader(b)); !errors.Is(err, snapshot.ErrFormat) {
			t.Errorf("ReadManifest(%q...): %v, want ErrFormat", b[:min(len(b), 8)], err)
		}
	}
}

func evilLayerNoManifest(t *testing.T) []byte {
	var buf bytes.Buffer
	zw, _ := zstd.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, ModTime: time.Unix(0, 0)})
	tw.Close()
	zw.Close()
	return buf.Bytes()
}
