package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/cgroup"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRemoveTrialDirs: a start removes the directories that trials of a
// process that died left in the state dir, and keeps the trials' cached
// answers.
func TestRemoveTrialDirs(t *testing.T) {
	state := t.TempDir()
	left := filepath.Join(state, "probe-123", "runsc")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	cached := filepath.Join(state, "probe-0123456789abcdef.json")
	if err := os.WriteFile(cached, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	removeTrialDirs(state)
	if _, err := os.Stat(filepath.Join(state, "probe-123")); !os.IsNotExist(err) {
		t.Fatalf("a trial's directory is left: %v", err)
	}
	if _, err := os.Stat(cached); err != nil {
		t.Fatalf("a cached answer went: %v", err)
	}
}

// TestTrialOfKilledProcessEnds: the container of a save trial that a
// killed sandboxd left running (started, never removed: what a SIGKILL
// during the trial started ahead leaves, as e2e's TestConsoleOperations
// does to its server) ends when the next start clears the state dir, and
// its cgroup goes with it. Its sandbox and gofer are not our children, and
// its agent would sleep five minutes.
func TestTrialOfKilledProcessEnds(t *testing.T) {
	runtimetest.Require(t, "runsc")
	state := t.TempDir()
	dir, err := newTrialDir(state)
	if err != nil {
		t.Fatal(err)
	}
	tc := &trialContainer{runsc: DefaultRunsc(), platform: "ptrace", dir: dir, cid: "probe-save-" + host.NewCID("")}
	// Whatever the test finds, nothing of the trial outlives it.
	defer func() {
		for _, pid := range trialProcs(dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		tc.remove()
	}()
	if err := tc.prepare(runtimetest.AgentBinary(t), []string{"/sandbox-agent", "version", "--wait"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tc.start(ctx); err != nil {
		t.Fatal(err)
	}
	if len(trialProcs(dir)) == 0 {
		t.Fatal("the trial container runs no process of its directory")
	}
	removeTrialDirs(state)
	deadline := time.Now().Add(5 * time.Second)
	for len(trialProcs(dir)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := trialProcs(dir); len(left) > 0 {
		t.Fatalf("processes of the killed process's trial still run after a start: %v", left)
	}
	if cgroup.New(trialCgroup(dir)).Exists() {
		t.Error("the trial's cgroup is left")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the trial's directory is left: %v", err)
	}
}

// trialProcs lists the host processes whose command line names the trial
// directory dir (runsc's sandbox and gofer name their --root and bundle).
func trialProcs(dir string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && (strings.Contains(string(b), dir+"/") || strings.Contains(string(b), dir+"\x00")) {
			out = append(out, pid)
		}
	}
	return out
}

// TestCancelledTrialLeavesNothing: a platform trial whose ctx ends while
// its sandbox runs (a server stopped during its start) returns with
// nothing of it left: no process, no cgroup, no directory.
func TestCancelledTrialLeavesNothing(t *testing.T) {
	runtimetest.Require(t, "runsc")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	state := t.TempDir()
	b, err := host.NewBase[*sandbox](ctx, Name, "runsc", host.Options{StateDir: state, Logger: runtimetest.Logger(t)}, host.Options{}, "runsc", "bin")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Abort()
	if err := installAgent(runtimetest.AgentBinary(t), filepath.Join(state, "bin", "sandbox-agent")); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{Base: b, log: b.Log()}
	// Cancel as soon as the trial's sandbox boots.
	booted := make(chan string, 1)
	go func() {
		for ctx.Err() == nil {
			for _, pid := range trialProcs(state) {
				cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
				if strings.Contains(string(cmdline), "\x00boot\x00") {
					dirs, _ := filepath.Glob(filepath.Join(state, "probe-*"))
					if len(dirs) == 1 {
						booted <- dirs[0]
					}
					cancel()
					return
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	out, err := r.trial(ctx, DefaultRunsc(), "ptrace", false, false)
	if ctx.Err() == nil {
		t.Skipf("the trial ended before its sandbox was seen booting: %q %v", out, err)
	}
	if err == nil {
		t.Logf("the trial answered before it was cancelled")
	}
	if left := trialProcs(state); len(left) > 0 {
		t.Errorf("processes of the cancelled trial still run: %v", left)
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	select {
	case dir := <-booted:
		if cgroup.New(trialCgroup(dir)).Exists() {
			t.Error("the trial's cgroup is left")
		}
	default:
	}
	if dirs, _ := filepath.Glob(filepath.Join(state, "probe-*")); len(dirs) > 0 {
		t.Errorf("the trial's directory is left: %v", dirs)
	}
}
