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

// leaks lists what is left on the host of a destroyed sandbox: mounts under
// the state dir, sandbox directories, runsc containers, cgroups and
// processes that mention the state dir.
func leaks(t *testing.T, stateDir, id string) []string {
	var out []string
	if _, err := os.Lstat(filepath.Join(stateDir, "ids", id)); err == nil {
		out = append(out, "id link")
	}
	live := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(stateDir, "sandboxes"))
	for _, e := range ents {
		live[e.Name()] = true
	}
	for _, m := range gvisor.MountsUnder(stateDir) {
		cid := strings.SplitN(strings.TrimPrefix(m, filepath.Join(stateDir, "sandboxes")+"/"), "/", 2)[0]
		if !live[cid] {
			out = append(out, "mount "+m)
		}
	}
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/sandboxd/sbx-*")
	for _, d := range cg {
		if !live[filepath.Base(d)] {
			out = append(out, "cgroup "+d)
		}
	}
	list, err := exec.Command("runsc", "--root", filepath.Join(stateDir, "runsc"), "list", "-quiet").Output()
	if err != nil {
		t.Errorf("runsc list: %v", err)
	}
	for _, cid := range strings.Fields(string(list)) {
		if !live[cid] {
			out = append(out, "runsc container "+cid)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if !strings.Contains(cmd, stateDir) {
			continue
		}
		keep := false
		for cid := range live {
			if strings.Contains(cmd, cid) {
				keep = true
			}
		}
		if !keep {
			out = append(out, "process "+cmd)
		}
	}
	return out
}
