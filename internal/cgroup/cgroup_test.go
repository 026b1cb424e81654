package cgroup_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/cgroup"
)

// TestWatchMemoryV1 runs a memory hog in a fresh v1 memory cgroup and checks
// that the watcher fires at the threshold, long before the hard limit, so a
// guard can act while the group still runs.
func TestWatchMemoryV1(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	if cgroup.Detect() != cgroup.V1 {
		t.Skip("this host uses the unified hierarchy; the v1 watcher does not apply")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	g := cgroup.Group{Version: cgroup.V1, Path: "/sandboxd-test-" + hex.EncodeToString(b[:])}
	dir := filepath.Join(cgroup.Root, "memory", g.Path)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a memory cgroup here: %v", err)
	}
	t.Cleanup(func() {
		if err := g.Remove(); err != nil {
			t.Error(err)
		}
		if g.Exists() {
			t.Error("cgroup left behind")
		}
	})
	const hard, threshold = 256 << 20, 32 << 20
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.Itoa(hard)), 0); err != nil {
		t.Fatal(err)
	}
	if got, err := g.MemoryLimit(); err != nil || got != hard {
		t.Fatalf("MemoryLimit %d %v", got, err)
	}
	// The hog joins the group before it starts eating: tail keeps a line
	// until its newline, and /dev/zero has none.
	cmd := exec.Command("sh", "-c", "echo $$ > "+filepath.Join(dir, "cgroup.procs")+" && exec tail /dev/zero")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fired := make(chan int64, 1)
	go func() {
		_ = g.WatchMemory(ctx, threshold, func() {
			st, _ := g.Stats()
			_ = cmd.Process.Signal(syscall.SIGKILL)
			select {
			case fired <- st.MemoryBytes:
			default:
			}
		})
	}()
	select {
	case usage := <-fired:
		if usage < threshold || usage >= hard {
			t.Errorf("fired at %d bytes, want between %d and %d", usage, threshold, hard)
		}
	case err := <-exited:
		t.Fatalf("the hog ended before the watcher fired: %v", err)
	case <-ctx.Done():
		t.Fatal("the watcher never fired")
	}
	<-exited
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil || len(procs) != 0 {
		t.Errorf("tasks left in the group: %q %v", procs, err)
	}
}
