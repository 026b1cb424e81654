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
	const hard, threshold = 256 << 20, 32 << 20
	g, dir := v1Group(t, hard)
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

// v1Group makes a fresh v1 memory cgroup with a hard limit, removed at the
// end of the test.
func v1Group(t *testing.T, hard int64) (cgroup.Group, string) {
	t.Helper()
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
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(hard, 10)), 0); err != nil {
		t.Fatal(err)
	}
	return g, dir
}

// TestWatchMemoryIgnoresPageCache writes and reads a file three times the
// threshold from inside the group: the page cache that fills the group's
// charge is not memory the group holds, and the watcher stays quiet. A
// memory hog started afterwards, while the cache still fills the charge
// (so no new threshold crossing happens), is still caught. A guard that
// counted the cache killed a sandbox's dd of a file larger than its memory.
func TestWatchMemoryIgnoresPageCache(t *testing.T) {
	const hard, threshold = 128 << 20, 48 << 20
	g, dir := v1Group(t, hard)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fired := make(chan cgroup.Stats, 16)
	go func() {
		_ = g.WatchMemory(ctx, threshold, func() {
			st, _ := g.Stats()
			select {
			case fired <- st:
			default:
			}
		})
	}()
	join := "echo $$ > " + filepath.Join(dir, "cgroup.procs") + " && "
	file := filepath.Join(t.TempDir(), "big")
	if out, err := exec.Command("sh", "-c", join+"dd if=/dev/zero of="+file+" bs=1M count=150 conv=fsync 2>&1 && cat "+file+" "+file+" > /dev/null").CombinedOutput(); err != nil {
		t.Fatalf("write and read a file in the group: %v %s", err, out)
	}
	st, err := g.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after the file: held %d MiB, page cache %d MiB", st.MemoryBytes>>20, st.CacheBytes>>20)
	if st.MemoryBytes+st.CacheBytes < threshold {
		t.Fatalf("the file's cache did not fill the group (%+v): the test proves nothing", st)
	}
	select {
	case st := <-fired:
		t.Fatalf("the watcher fired on page cache: %+v", st)
	case <-time.After(500 * time.Millisecond):
	}

	cmd := exec.Command("sh", "-c", join+"exec tail /dev/zero")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	select {
	case st := <-fired:
		if st.MemoryBytes < threshold {
			t.Errorf("fired holding %d bytes, below the threshold %d", st.MemoryBytes, threshold)
		}
	case <-ctx.Done():
		t.Fatal("the watcher never fired for the hog")
	}
}

// TestKill: Kill ends every process in the group, one that forks included,
// and the group can then go.
func TestKill(t *testing.T) {
	g, dir := v1Group(t, 256<<20)
	// A shell in the group that starts children of its own (in the group
	// too), and ignores the signals it can.
	cmd := exec.Command("sh", "-c", "echo $$ > "+filepath.Join(dir, "cgroup.procs")+"; trap '' TERM INT; sleep 600 & sleep 600 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	t.Cleanup(func() { _ = g.Kill(5 * time.Second) }) // also when the test fails early
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if procs, _ := g.Procs(); len(procs) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			procs, _ := g.Procs()
			t.Fatalf("the group has processes %v, want the shell and its two children", procs)
		}
	}
	if err := g.Kill(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if procs, err := g.Procs(); err != nil || len(procs) != 0 {
		t.Fatalf("after Kill: %v %v", procs, err)
	}
}
