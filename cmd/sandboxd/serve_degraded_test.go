package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// TestDegradedBanner: on a terminal, serve shows each degradation in a box
// of wrapped lines, what is lost first and why after it, and points at
// GET /api/health.
func TestDegradedBanner(t *testing.T) {
	var b bytes.Buffer
	writeDegradedBanner(&b, []gvisor.Degradation{{
		Summary: "gVisor fell back to runsc 0.0~20221219.0: the current gVisor did not boot its trial sandbox (serve's log says why; scripts/install-runsc.sh builds it again)",
		Detail:  "/usr/local/lib/sandboxd/runsc rejected: error executing umounter: fork/exec /proc/self/exe: no such file or directory; running /usr/bin/runsc",
	}})
	out := b.String()
	for _, want := range []string{"sandboxd runs DEGRADED", "  * gVisor fell back to runsc 0.0~20221219.0", "      why: /usr/local/lib/sandboxd/runsc rejected", `"degraded"`} {
		if !strings.Contains(out, want) {
			t.Errorf("banner lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 78 {
			t.Errorf("line of %d characters: %q", len(line), line)
		}
	}
	if got := degradedSummaries(nil); got != nil {
		t.Errorf("no degradation: %q, want nil (health omits the field)", got)
	}
}

func TestWrapWords(t *testing.T) {
	got := wrapWords("one two three four "+strings.Repeat("x", 12)+" five", 9)
	want := []string{"one two", "three", "four", strings.Repeat("x", 12), "five"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("wrapWords = %q, want %q", got, want)
	}
}
