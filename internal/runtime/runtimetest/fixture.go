// Package runtimetest is the conformance suite every runtime backend passes,
// plus the fixtures it needs: the busybox root filesystem and the
// sandbox-agent binary.
//
// The suite needs root and the backend's tools. Without them it skips with
// a reason, unless SANDBOXD_REQUIRE_RUNTIME=1 (CI), where it fails.
package runtimetest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/busybox"
)

// Require skips (or, with SANDBOXD_REQUIRE_RUNTIME=1, fails) the test unless
// it runs as root and every named tool is in PATH.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("runtime tests need %s", strings.Join(missing, ", "))
	if os.Getenv("SANDBOXD_REQUIRE_RUNTIME") == "1" {
		t.Fatal(msg + " (SANDBOXD_REQUIRE_RUNTIME=1)")
	}
	t.Skip(msg)
}

// Rootfs builds the busybox root filesystem in a test temp dir.
func Rootfs(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	if err := busybox.BuildRootfs(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

var agentOnce struct {
	sync.Once
	path string
	err  error
}

// AgentBinary builds cmd/sandbox-agent (static) once per test process and
// returns its path.
func AgentBinary(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sandbox-agent-")
		if err != nil {
			agentOnce.err = err
			return
		}
		agentOnce.path = filepath.Join(dir, "sandbox-agent")
		agentOnce.err = busybox.BuildAgent(agentOnce.path)
	})
	if agentOnce.err != nil {
		t.Fatal(agentOnce.err)
	}
	return agentOnce.path
}

// Logger is a backend's logger for a test: Info and above, each record in
// the test's log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Open starts a backend for a test: opts changed by mod (when not nil),
// then the backend's New; a failure fails the test.
func Open[O any, R runtime.Runtime](t testing.TB, newRuntime func(context.Context, O) (R, error), opts O, mod func(*O)) R {
	t.Helper()
	if mod != nil {
		mod(&opts)
	}
	r, err := newRuntime(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Opener adapts a test's constructor, which takes the backend's option
// changes, to Harness.New (no changes).
func Opener[O any, R runtime.Runtime](open func(t *testing.T, stateDir string, mod func(*O)) R) func(t *testing.T, stateDir string) runtime.Runtime {
	return func(t *testing.T, stateDir string) runtime.Runtime { return open(t, stateDir, nil) }
}
