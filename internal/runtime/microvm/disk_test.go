package microvm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestScanTree: a hard link's blocks count once, a hole's not at all; the fingerprint changes
// with a file's size, mode or owner; the disk is sized from the tree with
// bounded slack.
func TestScanTree(t *testing.T) {
	dir := t.TempDir()
	big := make([]byte, 8<<20)
	if err := os.WriteFile(filepath.Join(dir, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "big"), filepath.Join(dir, "big2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("big", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	// A sparse file of 1 TiB holds nothing: it takes no blocks.
	if err := os.WriteFile(filepath.Join(dir, "sparse"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dir, "sparse"), 1<<40); err != nil {
		t.Fatal(err)
	}
	tr, err := scanTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	// 8 MiB once, and the root directory's one block.
	if tr.entries != 5 || tr.blocks != 8<<20/4096+1 {
		t.Fatalf("tree %+v", tr)
	}
	inodes, size := tr.disk()
	if inodes < tr.entries || size < 8<<20 || size > 8<<20+8<<20/8+inodes*256+33<<20 || size%(1<<20) != 0 {
		t.Fatalf("disk of %d inodes, %d bytes for %+v", inodes, size, tr)
	}
	fp := tr.fingerprint
	for _, change := range []func() error{
		func() error { return os.WriteFile(filepath.Join(dir, "big"), []byte("small"), 0o644) },
		func() error { return os.Chmod(filepath.Join(dir, "big"), 0o4755) },
		func() error { return os.Lchown(filepath.Join(dir, "l"), 1000, 1000) },
	} {
		if err := change(); err != nil {
			if os.IsPermission(err) {
				continue
			}
			t.Fatal(err)
		}
		again, err := scanTree(dir)
		if err != nil {
			t.Fatal(err)
		}
		if again.fingerprint == fp {
			t.Fatal("a change left the fingerprint as it was")
		}
		fp = again.fingerprint
	}
}

// TestBaseKey: only a directory named after the digest its BaseImage names
// is keyed without a walk of its tree.
func TestBaseKey(t *testing.T) {
	hexd := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	dir := "/data/templates/sha256-" + hexd
	k, ok := baseKey(dir, "oci:sha256:"+hexd)
	if !ok || len(k) != 64 {
		t.Fatalf("content-addressed dir: %q %v", k, ok)
	}
	if k2, _ := baseKey("/other/templates/sha256-"+hexd, "oci:sha256:"+hexd); k2 == k {
		t.Error("two directories of one digest share a key")
	}
	for _, c := range []struct{ dir, image string }{
		{dir, "oci:sha256:" + hexd[:63] + "0"},                              // another digest
		{dir, "busybox-fixture"},                                            // not an OCI image
		{"/data/templates/rootfs", "oci:sha256:" + hexd},                    // not named by it
		{dir, "oci:sha512:" + hexd},                                         // not sha256
		{"/d/sha256-" + hexd[:62] + "zz", "oci:sha256:" + hexd[:62] + "zz"}, // not hex
	} {
		if _, ok := baseKey(c.dir, c.image); ok {
			t.Errorf("baseKey(%q, %q) keyed by name", c.dir, c.image)
		}
	}
}
