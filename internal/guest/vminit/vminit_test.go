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
