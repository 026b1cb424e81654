package microvm_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

func sh(t *testing.T, sb runtime.Sandbox, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &errb})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: exit %d, %v: %s", script, res.ExitCode, err, errb.String())
	}
	return out.String()
}

// TestTemplate starts sandboxes from a memory snapshot of a booted VM and
// compares that with a cold boot (the figures are logged, not asserted).
func TestTemplate(t *testing.T) {
	base := runtimetest.Rootfs(t)
	r := newRuntime(t, t.TempDir(), func(o *microvm.Options) {
		o.Template = microvm.TemplateOptions{BaseDir: base, BaseImage: "busybox-fixture"}
	})
	defer r.Close()
	deadline := time.Now().Add(3 * time.Minute)
	for !r.TemplateReady() {
		if time.Now().After(deadline) {
			t.Fatal("template not ready after 3 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	start := time.Now()
	cold, err := r.Create(ctx, runtime.Spec{ID: "cold", BaseDir: base, Hostname: "cold-boot"})
	if err != nil {
		t.Fatal(err)
	}
	coldTime := time.Since(start)
	defer cold.Destroy(context.Background())

	var clones []runtime.Sandbox
	var restoreTimes []time.Duration
	for _, id := range []string{"clone-a", "clone-b"} {
		start := time.Now()
		sb, err := r.Create(ctx, runtime.Spec{ID: id, BaseDir: base, BaseImage: "busybox-fixture", Env: []string{"WHO=" + id}})
		if err != nil {
			t.Fatal(err)
		}
		restoreTimes = append(restoreTimes, time.Since(start))
		defer sb.Destroy(context.Background())
		clones = append(clones, sb)
	}
	t.Logf("accel %s: cold boot to agent-ready %v; restore from template to agent-ready %v", cold.Info().Platform, coldTime.Round(time.Millisecond), restoreTimes)

	// Each clone is its own sandbox: its env, its files, its randomness,
	// and a clock set from the host.
	rand := map[string]bool{}
	for i, sb := range clones {
		id := sb.ID()
		if got := sh(t, sb, "echo $WHO; hostname"); got != id+"\nsandbox\n" {
			t.Errorf("clone %s: %q", id, got)
		}
		sh(t, sb, "echo "+id+" > /workspace/mine")
		rand[sh(t, sb, "head -c 16 /dev/urandom | od -An -tx1")] = true
		inside := strings.TrimSpace(sh(t, sb, "date +%s"))
		if d := time.Now().Unix() - parseInt(t, inside); d > 5 || d < -5 {
			t.Errorf("clone %d clock is off by %ds", i, d)
		}
	}
	if len(rand) != len(clones) {
		t.Error("clones share their random numbers")
	}
	if got := sh(t, clones[1], "cat /workspace/mine"); got != "clone-b\n" {
		t.Errorf("clone-b sees %q", got)
	}
	// Snapshots of a clone work as of any sandbox.
	var blob bytes.Buffer
	if _, err := clones[0].Snapshot(ctx, &blob); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, cold, "hostname"); got != "cold-boot\n" {
		t.Errorf("cold sandbox hostname %q", got)
	}
}

// TestPauseResume saves a running sandbox's memory, within what
// MaxSaveBytes bounds it by, and brings it back with its processes.
func TestPauseResume(t *testing.T) {
	base := runtimetest.Rootfs(t)
	state := t.TempDir()
	r := newRuntime(t, state, nil) // sandboxes of 256 MiB
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := r.Create(ctx, runtime.Spec{ID: "sleeper", BaseDir: base})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	sh(t, sb, "echo kept > /workspace/f; (sleep 600 & echo $! > /workspace/pid) >/dev/null 2>&1")
	pid := strings.TrimSpace(sh(t, sb, "cat /workspace/pid"))
	start := time.Now()
	if err := r.Pause(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	pause := time.Since(start)
	if st, _ := sb.State(ctx); st != runtime.StatePaused {
		t.Errorf("paused sandbox is %s", st)
	}
	if microvm.PID(sb) != 0 {
		t.Error("QEMU still runs while paused")
	}
	// The node reserves MaxSaveBytes of its disk before a pause.
	saved, err := filepath.Glob(filepath.Join(state, "sandboxes", "*", "memory.state"))
	if err != nil || len(saved) != 1 {
		t.Fatalf("saved memory: %v %v", saved, err)
	}
	fi, err := os.Stat(saved[0])
	if err != nil {
		t.Fatal(err)
	}
	if bound := r.MaxSaveBytes(runtime.Limits{MemoryBytes: 256 << 20}); fi.Size() > bound {
		t.Errorf("saved memory of %d bytes, over the %d bytes MaxSaveBytes reserves for it", fi.Size(), bound)
	}
	start = time.Now()
	if err := r.Resume(ctx, "sleeper"); err != nil {
		t.Fatal(err)
	}
	t.Logf("pause %v, resume to agent-ready %v, saved memory %.1f MiB", pause.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), float64(fi.Size())/(1<<20))
	if got := sh(t, sb, "cat /workspace/f; test -d /proc/"+pid+" && echo alive"); got != "kept\nalive\n" {
		t.Errorf("after resume: %q", got)
	}
}

func parseInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a number: %q", s)
		}
		n = n*10 + int64(c-'0')
	}
	return n
}
