package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
)

// EnvFakeRuntime, set to 1, lets `serve --runtime fake` start: sandboxes
// that exist only in the server's memory and run nothing (every exec exits
// 0 with no output). It is for measuring the control plane (`sandboxd
// bench cluster`) and for tests; a server on it isolates nothing and runs
// no code, so it is refused without this variable and says so loudly with
// it (a WARN at start and "degraded" in GET /api/health).
const EnvFakeRuntime = "SANDBOXD_FAKE_RUNTIME"

// fakeRuntimeName is --runtime's value for the fake backend.
const fakeRuntimeName = "fake"

// checkFakeRuntime refuses --runtime fake unless EnvFakeRuntime allows it.
func checkFakeRuntime() error {
	if os.Getenv(EnvFakeRuntime) != "1" {
		return flagErrorf("runtime", "--runtime fake simulates sandboxes (they run nothing) for benchmarks and tests only: set %s=1 to use it", EnvFakeRuntime)
	}
	return nil
}

// benchFakeRuntime is the fake backend as serve runs it: runtimefake's
// in-memory sandboxes, always reported degraded.
type benchFakeRuntime struct{ *runtimefake.Runtime }

// newFakeRuntime starts the fake backend and warns that it is one.
func newFakeRuntime(log *slog.Logger) *benchFakeRuntime {
	log.Warn("runtime fake: sandboxes are simulated in memory and run no code; for benchmarks and tests only, never for users",
		"env", fmt.Sprintf("%s=1", EnvFakeRuntime))
	return &benchFakeRuntime{runtimefake.New()}
}

// Degraded says, in GET /api/health and the start banner, that nothing
// runs.
func (*benchFakeRuntime) Degraded() []gvisor.Degradation {
	return []gvisor.Degradation{{
		Summary: "runtime fake: sandboxes are simulated and run no code (benchmarks and tests only)",
		Detail:  "serve was started with --runtime fake and " + EnvFakeRuntime + "=1",
	}}
}
