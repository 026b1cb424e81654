package gvisor_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

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
		Logger:    slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		// Small defaults keep 10+ sandboxes cheap on a CI machine.
		DefaultLimits: runtime.Limits{CPUs: 1, MemoryBytes: 512 << 20, Pids: 512, DiskBytes: 256 << 20},
	}
	if mod != nil {
		mod(&opts)
	}
	r, err := gvisor.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func TestConformance(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{
		New: func(t *testing.T, stateDir string) runtime.Runtime {
			return newRuntime(t, stateDir, nil)
		},
		Leaks: leaks,
	})
}

// leaks finds the sandbox's container id before it is destroyed and then
// lists what is left of it on the host: its directory, mounts, runsc
// container, cgroups and processes.
func leaks(t *testing.T, stateDir string, sb runtime.Sandbox) func() []string {
	target, err := os.Readlink(filepath.Join(stateDir, "ids", sb.ID()))
	if err != nil {
		t.Fatalf("find container of %s: %v", sb.ID(), err)
	}
	cid := filepath.Base(target)
	return func() []string {
		var out []string
		dir := filepath.Join(stateDir, "sandboxes", cid)
		if _, err := os.Lstat(filepath.Join(stateDir, "ids", sb.ID())); err == nil {
			out = append(out, "id link")
		}
		if _, err := os.Stat(dir); err == nil {
			out = append(out, "directory "+dir)
		}
		for _, m := range gvisor.MountsUnder(dir) {
			out = append(out, "mount "+m)
		}
		cg, _ := filepath.Glob("/sys/fs/cgroup/*/sandboxd/" + cid)
		for _, d := range cg {
			out = append(out, "cgroup "+d)
		}
		list, err := exec.Command("runsc", "--root", filepath.Join(stateDir, "runsc"), "list", "-quiet").Output()
		if err != nil {
			t.Errorf("runsc list: %v", err)
		}
		for _, c := range strings.Fields(string(list)) {
			if c == cid {
				out = append(out, "runsc container "+c)
			}
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), cid) {
				out = append(out, "process "+strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		return out
	}
}
