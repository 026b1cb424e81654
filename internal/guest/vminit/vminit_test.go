package vminit

import (
	"maps"
	"slices"
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
