package gvisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/cgroup"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestDestroyKillsLostProcesses: a process in the sandbox's host cgroup
// that runsc does not know of (what a create cut short before runsc
// recorded its container leaves: its sandbox and gofer processes) is
// killed by Destroy, and the cgroup goes with it.
func TestDestroyKillsLostProcesses(t *testing.T) {
	runtimetest.Require(t, "runsc", "mkfs.ext4")
	ctx := context.Background()
	rt, err := New(ctx, Options{
		StateDir: t.TempDir(), AgentPath: runtimetest.AgentBinary(t), Logger: runtimetest.Logger(t),
		DefaultLimits: runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 256, DiskBytes: 64 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	sb, err := rt.Create(ctx, runtime.Spec{ID: "lost", BaseDir: runtimetest.Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	g := cgroup.New(sb.(*sandbox).Meta().CgroupPath)
	lost := exec.Command("sleep", "600")
	if err := lost.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = lost.Wait(); close(exited) }()
	defer lost.Process.Kill()
	for _, d := range g.Dirs() {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(lost.Process.Pid)), 0); err != nil {
			t.Fatalf("put the process in %s: %v", d, err)
		}
	}
	// runsc delete, which finds a process it did not start in the group,
	// may fail: what matters is that nothing is left.
	if err := sb.Destroy(ctx); err != nil {
		t.Logf("destroy: %v", err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the process runsc did not know of still runs after Destroy")
	}
	if g.Exists() {
		t.Error("the sandbox's cgroup is left")
	}
}
