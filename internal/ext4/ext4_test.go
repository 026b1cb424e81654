package ext4

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCreate(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	from := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(from, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(from, "etc", "marker"), []byte("hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "disk.img")
	const size = 64 << 20
	if err := Create(ctx, img, size, Options{Label: "test-disk", Inodes: 8192, From: from, RootOwner: true, Lazy: true}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(img)
	if err != nil || fi.Size() != size {
		t.Fatalf("image: %v, %v", fi, err)
	}
	if debugfs, err := exec.LookPath("debugfs"); err == nil {
		out, err := exec.Command(debugfs, "-R", "cat /etc/marker", img).Output()
		if err != nil || string(out) != "hi\n" {
			t.Errorf("debugfs cat /etc/marker = %q, %v", out, err)
		}
	}
	if e2fsck, err := exec.LookPath("e2fsck"); err == nil {
		if out, err := exec.Command(e2fsck, "-fn", img).CombinedOutput(); err != nil {
			t.Errorf("e2fsck: %v\n%s", err, out)
		}
	}
	// The path must be new: an existing image is never formatted over.
	if err := Create(ctx, img, size, Options{}); err == nil || !strings.Contains(err.Error(), "create disk image") {
		t.Fatalf("Create over an existing file: %v", err)
	}
	// A failed mkfs leaves no file behind.
	bad := filepath.Join(dir, "bad.img")
	if err := Create(ctx, bad, size, Options{From: filepath.Join(dir, "missing")}); err == nil {
		t.Fatal("mkfs of a missing tree succeeded")
	}
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Fatalf("failed image left: %v", err)
	}
}
