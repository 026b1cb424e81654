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

// TestCreateKeepsOwners: a tree like an unpacked image's (files of uid
// 1000, a setuid file, a hard link, a symlink, a tree root of another
// owner) keeps all of it but the root directory's owner with RootOwner.
func TestCreateKeepsOwners(t *testing.T) {
	debugfs, err := exec.LookPath("debugfs")
	if err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	dir := t.TempDir()
	from := filepath.Join(dir, "tree")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(from, "home", "app"), 0o755))
	must(os.MkdirAll(filepath.Join(from, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(from, "home", "app", "own"), []byte("mine\n"), 0o600))
	must(os.Chown(filepath.Join(from, "home", "app", "own"), 1000, 1001))
	must(os.Chown(filepath.Join(from, "home", "app"), 1000, 1001))
	must(os.Chmod(filepath.Join(from, "home", "app"), 0o750))
	must(os.WriteFile(filepath.Join(from, "bin", "su"), []byte("x"), 0o755))
	must(os.Chmod(filepath.Join(from, "bin", "su"), 0o4755|os.ModeSetuid))
	must(os.Link(filepath.Join(from, "bin", "su"), filepath.Join(from, "bin", "su2")))
	must(os.Symlink("su", filepath.Join(from, "bin", "sulink")))
	must(os.Chown(from, 1000, 1000))
	img := filepath.Join(dir, "disk.img")
	must(Create(context.Background(), img, 64<<20, Options{From: from, RootOwner: true, NoJournal: true, Lazy: true}))

	stat := func(p string) string {
		t.Helper()
		out, err := exec.Command(debugfs, "-R", "stat "+p, img).Output()
		if err != nil {
			t.Fatalf("debugfs stat %s: %v", p, err)
		}
		return string(out)
	}
	for p, want := range map[string][]string{
		"/":             {"Mode:  0755", "User:     0   Group:     0"},
		"/home/app":     {"Mode:  0750", "User:  1000   Group:  1001"},
		"/home/app/own": {"Mode:  0600", "User:  1000   Group:  1001"},
		"/bin/su":       {"Mode:  04755", "User:     0", "Links: 2"},
		"/bin/sulink":   {"Type: symlink", `Fast link dest: "su"`},
	} {
		got := stat(p)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: want %q in\n%s", p, w, got)
			}
		}
	}
	if a, b := inode(t, debugfs, img, "/bin/su"), inode(t, debugfs, img, "/bin/su2"); a == "" || a != b {
		t.Errorf("hard link: inodes %q and %q", a, b)
	}
	if out, _ := exec.Command(debugfs, "-R", "features", img).Output(); strings.Contains(string(out), "has_journal") {
		t.Errorf("NoJournal: %s", out)
	}
}

func inode(t *testing.T, debugfs, img, p string) string {
	t.Helper()
	out, err := exec.Command(debugfs, "-R", "ls -l "+filepath.Dir(p), img).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[len(f)-1] == filepath.Base(p) {
			return f[0]
		}
	}
	return ""
}
