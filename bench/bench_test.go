package bench_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRunSmall runs every phase with tiny counts: it checks the bench works
// and fills its report, not how fast anything is.
func TestRunSmall(t *testing.T) {
	runtimetest.Require(t, "runsc", "mkfs.ext4")
	rep, err := bench.Run(context.Background(), bench.Options{
		Rootfs:     runtimetest.Rootfs(t),
		StateDir:   filepath.Join(t.TempDir(), "state"),
		AgentPath:  runtimetest.AgentBinary(t),
		Iterations: 2,
		Concurrent: 3,
		LayerMiB:   4,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	for name, tm := range map[string]bench.Timing{
		"create_cold": rep.CreateCold, "create_warm": rep.CreateWarm, "exec_true": rep.ExecTrue,
		"runsc_exec": rep.RunscExec, "runsc_run": rep.Baseline.RunscRun, "concurrent": rep.Concurrent.Each,
	} {
		if tm.N == 0 || tm.P50 <= 0 || tm.P90 < tm.P50 {
			t.Errorf("%s: %+v", name, tm)
		}
	}
	if !rep.Snapshot.VerifiedSame || rep.Snapshot.LayerMiB < 4 || rep.Concurrent.IdleRSSMiB <= 0 {
		t.Errorf("snapshot %+v concurrent %+v", rep.Snapshot, rep.Concurrent)
	}
}

// TestRunPauseSmall runs the pause bench once with little memory touched
// and a fork of 2: it checks the bench works, not how fast anything is.
func TestRunPauseSmall(t *testing.T) {
	runtimetest.Require(t, "runsc", "mkfs.ext4")
	rep, err := bench.RunPause(context.Background(), bench.PauseOptions{
		Rootfs:     runtimetest.Rootfs(t),
		StateDir:   filepath.Join(t.TempDir(), "state"),
		AgentPath:  runtimetest.AgentBinary(t),
		Iterations: 1,
		TouchMiB:   8,
		ForkCount:  2,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	for name, tm := range map[string]bench.Timing{
		"pause_idle": rep.PauseIdle, "resume_idle": rep.ResumeIdle, "pause_touched": rep.PauseTouched,
		"resume_touched": rep.ResumeTouched, "fork_idle": rep.ForkIdle, "fork_touched": rep.ForkTouched,
		"runsc_checkpoint": rep.Baseline.Checkpoint, "runsc_restore": rep.Baseline.Restore,
	} {
		if tm.N == 0 || tm.P50 <= 0 {
			t.Errorf("%s: %+v", name, tm)
		}
	}
}
