package vminit

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	got := parseCmdline("console=ttyS0 reboot=t sandboxd.hostname=box sandboxd.memory=134217728 sandboxd.pids=512 quiet rdinit=/sandbox-agent -- vm-init sandboxd.probe=1\n")
	want := map[string]string{paramHostname: "box", paramMemory: "134217728", paramPids: "512"}
	if !maps.Equal(got, want) {
		t.Errorf("parseCmdline = %v, want %v (nothing after --)", got, want)
	}
}

// TestLowerOrder checks the order overlayfs gets the restored layers in:
// the newest (highest index) first, by number rather than by name.
func TestLowerOrder(t *testing.T) {
	dirs := []string{"/layer/lower-0", "/layer/lower-10", "/layer/lower-2", "/layer/lower-1"}
	sortLowers(dirs)
	if want := []string{"/layer/lower-10", "/layer/lower-2", "/layer/lower-1", "/layer/lower-0"}; !slices.Equal(dirs, want) {
		t.Errorf("order %v, want %v", dirs, want)
	}
}

func TestTmpSize(t *testing.T) {
	for memory, want := range map[string]string{"1342177280": "size=655360k", "": "size=50%", "0": "size=50%", "x": "size=50%"} {
		if got := tmpSize(memory); got != want {
			t.Errorf("tmpSize(%q) = %q, want %q", memory, got, want)
		}
	}
}

// TestMountPoints: an image without /dev, /proc or /sys gets them; one
// whose mount point is a symlink is refused, naming it.
func TestMountPoints(t *testing.T) {
	root := t.TempDir()
	if err := os.Mkdir(root+"/dev", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := mountPoints(root, "/dev", "/proc", "/sys"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if fi, err := os.Lstat(root + d); err != nil || !fi.IsDir() {
			t.Errorf("%s: %v %v", d, fi, err)
		}
	}
	if err := os.Symlink("/", root+"/run"); err != nil {
		t.Fatal(err)
	}
	if err := mountPoints(root, "/run"); err == nil || !strings.Contains(err.Error(), "/run is not a directory") {
		t.Fatalf("symlink mount point: %v", err)
	}
}

// TestRootFile: what a bind mount over /etc/resolv.conf covers: the file,
// made when missing; where the image's symlink leads, inside the root even
// when the link points out of it; nothing when it is a directory.
func TestRootFile(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(root+"/etc", 0o755); err != nil {
		t.Fatal(err)
	}
	got, ok, err := rootFile(root, "/etc/hosts")
	if err != nil || !ok || got != root+"/etc/hosts" {
		t.Fatalf("missing file: %q %v %v", got, ok, err)
	}
	if fi, err := os.Lstat(got); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("not made: %v %v", fi, err)
	}
	for link, want := range map[string]string{
		"../run/systemd/resolve/stub-resolv.conf": root + "/run/systemd/resolve/stub-resolv.conf",
		"/run/abs.conf":               root + "/run/abs.conf",
		"../../../../../outside.conf": root + "/outside.conf",
	} {
		_ = os.Remove(root + "/etc/resolv.conf")
		if err := os.Symlink(link, root+"/etc/resolv.conf"); err != nil {
			t.Fatal(err)
		}
		got, ok, err := rootFile(root, "/etc/resolv.conf")
		if err != nil || !ok || got != want {
			t.Errorf("symlink to %s: %q %v %v, want %s", link, got, ok, err, want)
		}
		if fi, err := os.Lstat(want); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("symlink to %s: target not made: %v", link, err)
		}
	}
	if err := os.Mkdir(root+"/etc/dir", 0o755); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := rootFile(root, "/etc/dir"); err != nil || ok {
		t.Errorf("directory: %v %v", ok, err)
	}
}
