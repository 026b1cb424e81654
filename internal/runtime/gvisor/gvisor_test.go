package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

func newRuntime(t *testing.T, stateDir string, mod func(*gvisor.Options)) *gvisor.Runtime {
	t.Helper()
	runtimetest.Require(t, "runsc", "mkfs.ext4")
	opts := gvisor.Options{
		StateDir:  stateDir,
		AgentPath: runtimetest.AgentBinary(t),
		Logger:    runtimetest.Logger(t),
		// Small defaults keep 10+ sandboxes cheap on a CI machine.
		DefaultLimits: runtime.Limits{CPUs: 1, MemoryBytes: 512 << 20, Pids: 512, DiskBytes: 256 << 20},
		// The conformance suite's Prewarm test counts on a budget of 2.
		Prewarm: 2,
		// As serve: SANDBOXD_RUNSC names the runsc; empty, the backend
		// chooses (the current one when it boots, else Debian's).
		RunscPath: os.Getenv("SANDBOXD_RUNSC"),
	}
	// A current runsc pins a network namespace at runsc/null-netns (see
	// unmountNullNetns); Close unmounts it, but a test that fails first
	// would leave stateDir unremovable.
	t.Cleanup(func() {
		for syscall.Unmount(filepath.Join(stateDir, "runsc", "null-netns"), syscall.MNT_DETACH) == nil {
		}
	})
	return runtimetest.Open(t, gvisor.New, opts, mod)
}

func TestConformance(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{New: runtimetest.Opener(newRuntime), Leaks: leaks})
}

// leaks lists what is left of a sandbox on the host after Destroy: what
// every backend leaves (runtimetest.HostLeaks), runsc containers and
// processes.
var leaks = runtimetest.HostLeaks(func(t *testing.T, stateDir, cid string) []string {
	var out []string
	// Every runsc the backend may have chosen: each lists its own.
	seen := map[string]bool{}
	for _, runsc := range []string{os.Getenv("SANDBOXD_RUNSC"), gvisor.DefaultRunsc(), "runsc"} {
		if runsc == "" || seen[runsc] {
			continue
		}
		seen[runsc] = true
		list, err := exec.Command(runsc, "--root", filepath.Join(stateDir, "runsc"), "list", "-quiet").Output()
		if err != nil {
			t.Errorf("%s list: %v", runsc, err)
		}
		for _, c := range strings.Fields(string(list)) {
			if c == cid {
				out = append(out, "runsc container "+c)
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), cid) {
			out = append(out, "process "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
})

func TestWarmPool(t *testing.T) {
	base := runtimetest.Rootfs(t)
	state := t.TempDir()
	r := newRuntime(t, state, func(o *gvisor.Options) {
		o.WarmPool, o.WarmBaseDir, o.WarmBaseImage = 2, base, "busybox-fixture"
	})
	defer r.Close()
	ctx := context.Background()
	waitWarm(t, r, 2)
	before := time.Now()
	sb, err := r.Create(ctx, runtime.Spec{ID: "warm-1", BaseDir: base, BaseImage: "busybox-fixture", Env: []string{"WHO=warm"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	// It was started before Create was called: its bundle is older.
	target, err := os.Readlink(filepath.Join(state, "ids", "warm-1"))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(state, "sandboxes", filepath.Base(target), "bundle", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.ModTime().Before(before) {
		t.Fatalf("sandbox was created cold (bundle written %v, create called %v)", fi.ModTime(), before)
	}
	var out strings.Builder
	if _, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", "echo $WHO; ls /workspace | wc -l"}, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "warm\n0\n" {
		t.Fatalf("warm sandbox: %q", out.String())
	}
	// The pool refills, and a spec that does not fit (a restored layer, other
	// limits) is created cold.
	waitWarm(t, r, 2)
	other, err := r.Create(ctx, runtime.Spec{ID: "cold-1", BaseDir: base, Limits: runtime.Limits{Pids: 100}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Destroy(ctx)
	if r.WarmReady() != 2 {
		t.Errorf("a cold create took a warm sandbox: %d left", r.WarmReady())
	}
	// Sized up, the pool starts more; sized down, it destroys the
	// surplus (counted as discarded).
	r.SetWarmSize(3)
	waitWarm(t, r, 3)
	r.SetWarmSize(2)
	if st := r.PoolStats().Warm; st.Ready != 2 || st.Size != 2 || st.Discarded != 1 {
		t.Errorf("after sizing 3 then 2: %+v", st)
	}
	waitDirs(t, state, 4) // 2 warm, warm-1 and cold-1: the surplus is gone
	// Close destroys the unclaimed warm sandboxes but not the claimed ones.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(state, "sandboxes"))
	if len(ents) != 2 {
		t.Errorf("after close %d sandbox dirs, want the 2 claimed", len(ents))
	}
	r2 := newRuntime(t, state, nil)
	defer r2.Close()
	for _, id := range []string{"warm-1", "cold-1"} {
		s, err := r2.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Destroy(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitDirs waits until the runtime's state has n sandbox directories.
func waitDirs(t *testing.T, state string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ents, _ := os.ReadDir(filepath.Join(state, "sandboxes"))
		if len(ents) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sandbox directories after a minute, want %d", len(ents), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitWarm(t *testing.T, r *gvisor.Runtime, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for r.WarmReady() < n {
		if time.Now().After(deadline) {
			t.Fatalf("warm pool has %d of %d after a minute", r.WarmReady(), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLimitsApplied checks each limit where it is enforced: the host cgroup
// (CPU quota, memory hard cap), RLIMIT_NPROC inside, and the size of the
// writable layer's file system.
func TestLimitsApplied(t *testing.T) {
	state := t.TempDir()
	r := newRuntime(t, state, nil)
	defer r.Close()
	ctx := context.Background()
	lim := runtime.Limits{CPUs: 0.5, MemoryBytes: 300 << 20, Pids: 100, DiskBytes: 128 << 20}
	sb, err := r.Create(ctx, runtime.Spec{ID: "limits", BaseDir: runtimetest.Rootfs(t), Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	target, err := os.Readlink(filepath.Join(state, "ids", "limits"))
	if err != nil {
		t.Fatal(err)
	}
	cg := "/sandboxd/" + filepath.Base(target)
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := read("/sys/fs/cgroup/cpu" + cg + "/cpu.cfs_quota_us"); got != "50000" {
		t.Errorf("cfs quota %s, want 50000 (0.5 CPU)", got)
	}
	hard, _ := strconv.ParseInt(read("/sys/fs/cgroup/memory"+cg+"/memory.limit_in_bytes"), 10, 64)
	if hard <= lim.MemoryBytes || hard > 2*lim.MemoryBytes {
		t.Errorf("memory hard limit %d for a %d limit", hard, lim.MemoryBytes)
	}
	var out strings.Builder
	if _, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", "ulimit -u; df -k / | tail -1"}, Stdout: &out}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || lines[0] != "100" {
		t.Fatalf("inside: %q, want process limit 100", out.String())
	}
	st, err := sb.Stats(ctx)
	if err != nil || st.MemoryBytes <= 0 || st.Pids <= 0 || st.DiskBytes <= 0 || st.Processes <= 0 {
		t.Errorf("stats %+v %v", st, err)
	}
}
