package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// eachRunsc runs fn as the subtests "current" and "debian", on a runtime
// of the current runsc (gvisor.BundledRunsc) and of Debian's December
// 2022 one (runsc in PATH), whatever SANDBOXD_RUNSC says; one that is not
// installed is skipped.
func eachRunsc(t *testing.T, fn func(t *testing.T, r *gvisor.Runtime)) {
	debian, _ := exec.LookPath("runsc")
	for _, rs := range []struct{ name, path string }{{"current", gvisor.BundledRunsc}, {"debian", debian}} {
		t.Run(rs.name, func(t *testing.T) {
			if _, err := os.Stat(rs.path); rs.path == "" || err != nil {
				t.Skipf("the %s runsc is not installed", rs.name)
			}
			r := newRuntime(t, t.TempDir(), func(o *gvisor.Options) { o.RunscPath = rs.path })
			defer r.Close()
			fn(t, r)
		})
	}
}

// TestTerminalSignals: ^C on a terminal interrupts its foreground job on
// both runscs. The current one's terminals send the signals themselves;
// Debian's 2022 one's do not, which the backend's probe finds, and its
// agent sends them.
func TestTerminalSignals(t *testing.T) {
	eachRunsc(t, func(t *testing.T, r *gvisor.Runtime) {
		t.Logf("%s: the agent sends terminal signals: %v", r.Runsc(), r.Runsc().NoTTYSignals)
		if r.Runsc().NoTTYSignals != r.Runsc().StatxShim {
			t.Errorf("%s: the agent sends terminal signals %v, but the runsc is 2022's %v", r.Runsc(), r.Runsc().NoTTYSignals, r.Runsc().StatxShim)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		sb, err := r.Create(ctx, runtime.Spec{ID: "tty", BaseDir: runtimetest.Rootfs(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.Background())
		runtimetest.TerminalSignals(t, sb)
		// The helper runs as whoever the command runs as.
		if got := mustSh(ctx, t, sb, "su -s /bin/sh nobody -c '/run/sandboxd/bin/sandbox-agent version' 2>&1"); !strings.HasPrefix(got, "sandbox-agent ") {
			t.Fatalf("the agent binary run by another user: %q", got)
		}
	})
}
