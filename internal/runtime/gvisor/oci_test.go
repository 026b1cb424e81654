package gvisor

import (
	"slices"
	"testing"
)

// TestTmpMount: /tmp is a tmpfs of half the memory limit, or runsc's
// unsized one when the sandbox has no limit.
func TestTmpMount(t *testing.T) {
	if m := tmpMount(1280 << 20); m.Destination != "/tmp" || m.Type != "tmpfs" || !slices.Contains(m.Options, "size=655360k") {
		t.Errorf("tmpMount(1280 MiB) = %+v", m)
	}
	for _, o := range tmpMount(0).Options {
		if len(o) > 5 && o[:5] == "size=" {
			t.Errorf("tmpMount without a limit has %s", o)
		}
	}
}
