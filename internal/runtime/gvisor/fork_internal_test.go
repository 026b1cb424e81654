package gvisor

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestForkRecoversParent: a fork whose save ends the parent's container
// fails, and the parent runs on from where it was, restored from what the
// save wrote; nothing of the child is left. The save that ends it is
// Debian's 2022 runsc's `checkpoint --leave-running` of a paused
// container (it saves, then panics with the container gone), which the
// save trial has forks avoid: the test claims the trial found it works.
func TestForkRecoversParent(t *testing.T) {
	runtimetest.Require(t, "runsc", "mkfs.ext4")
	debian, err := exec.LookPath("runsc")
	if err != nil {
		t.Skip("no runsc in PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rt, err := New(ctx, Options{
		StateDir: t.TempDir(), AgentPath: runtimetest.AgentBinary(t), Logger: runtimetest.Logger(t), RunscPath: debian,
		DefaultLimits: runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 256, DiskBytes: 64 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	if rt.Runsc().StatxShim == false {
		t.Skipf("%s is not Debian's 2022 runsc", rt.Runsc())
	}
	sb, err := rt.Create(ctx, runtime.Spec{ID: "parent", BaseDir: runtimetest.Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	sh := func(script string) string {
		t.Helper()
		var out, errb strings.Builder
		res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &errb})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%q: %v %+v %s", script, err, res, errb.String())
		}
		return out.String()
	}
	count := func() int {
		t.Helper()
		n, err := strconv.Atoi(strings.TrimSpace(sh("cat /tmp/count")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	sh(`(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &
sleep 0.5`)
	before := count()

	rt.saves.ahead.Wait() // its answer would replace the claim
	key, err := rt.saveProbeKey(ctx, debian, rt.platform)
	if err != nil {
		t.Fatal(err)
	}
	rt.saves.mu.Lock()
	rt.rememberSave(key, saveSupport{LeaveRunning: true})
	rt.saves.mu.Unlock()

	if _, err := rt.Fork(ctx, "parent", []runtime.Spec{{ID: "child"}}); err == nil {
		t.Fatal("the fork succeeded: the save did not end the container, nothing was tested")
	} else {
		t.Logf("fork: %v", err)
	}
	if st, err := sb.State(ctx); err != nil || st != runtime.StateRunning {
		t.Fatalf("the parent after the failed fork: %v %v", st, err)
	}
	after := count()
	if after < before {
		t.Fatalf("the counter was %d before the fork and %d after it: the parent started over", before, after)
	}
	deadline := time.Now().Add(30 * time.Second)
	for count() <= after {
		if time.Now().After(deadline) {
			t.Fatal("the parent's counter stopped after the failed fork")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := rt.Get(ctx, "child"); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("the child after the failed fork: %v", err)
	}
	if !strings.Contains(sh("ls /workspace; echo ok"), "ok") {
		t.Fatal("exec in the parent")
	}
}
