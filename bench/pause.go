package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// PauseOptions say what RunPause measures and where.
type PauseOptions struct {
	Rootfs, StateDir, AgentPath, RunscPath, Platform string
	Iterations                                       int // samples per timing (default 5)
	TouchMiB                                         int // random bytes a "touched" sandbox holds in memory (default 256)
	ForkCount                                        int // children per fork (default 5)
	Logger                                           *slog.Logger
	Progress                                         progress.Tracker
}

// PauseReport is what RunPause measured on the gVisor backend: pause and
// resume (runtime.Pauser) of an idle sandbox and of one holding TouchMiB of
// random bytes in its memory, fork of ForkCount (runtime.Forker) of each,
// and the bare `runsc checkpoint` and `runsc restore` of an idle container
// of the same root filesystem as the baseline, in one run.
type PauseReport struct {
	Backend   string `json:"backend"`
	Platform  string `json:"platform"`
	Runsc     string `json:"runsc"`
	CPUs      int    `json:"host_cpus"`
	TouchMiB  int    `json:"touched_mib"`
	ForkCount int    `json:"fork_count"`

	PauseIdle     Timing `json:"pause_idle"`     // Pause until it returns (memory saved, processes ended)
	ResumeIdle    Timing `json:"resume_idle"`    // Resume until the agent answers
	PauseTouched  Timing `json:"pause_touched"`  // the same, TouchMiB held
	ResumeTouched Timing `json:"resume_touched"` //
	ForkIdle      Timing `json:"fork_idle"`      // Fork of ForkCount until every child's agent answers
	ForkTouched   Timing `json:"fork_touched"`   //

	Baseline struct {
		Checkpoint Timing `json:"runsc_checkpoint"` // bare runsc checkpoint of an idle container
		Restore    Timing `json:"runsc_restore"`    // bare runsc restore --detach of it
	} `json:"baseline"`
}

// RunPause measures and cleans up after itself.
func RunPause(ctx context.Context, o PauseOptions) (_ PauseReport, err error) {
	if o.Iterations <= 0 {
		o.Iterations = 5
	}
	if o.TouchMiB <= 0 {
		o.TouchMiB = 256
	}
	if o.ForkCount <= 0 {
		o.ForkCount = 5
	}
	ph := startPhases(progress.Or(o.Progress), "bench pause", 3)
	defer func() { ph.done(err) }()
	rep := PauseReport{CPUs: goruntime.NumCPU(), TouchMiB: o.TouchMiB, ForkCount: o.ForkCount}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	defer os.RemoveAll(o.StateDir)
	// Touched sandboxes and their children hold TouchMiB each.
	limits := runtime.Limits{CPUs: 1, MemoryBytes: int64(o.TouchMiB+256) << 20, Pids: 1024, DiskBytes: 1 << 30}
	b := &bencher{o: Options{Rootfs: o.Rootfs, StateDir: o.StateDir, AgentPath: o.AgentPath, RunscPath: o.RunscPath,
		Platform: o.Platform, Limits: limits, Logger: o.Logger, Iterations: o.Iterations}, rep: &Report{Platform: o.Platform}}
	b.o.defaults()
	rt, err := b.newRuntime(ctx, "pause", 0)
	if err != nil {
		return rep, err
	}
	defer rt.Close()
	rep.Backend, rep.Platform, rep.Runsc = rt.Name(), b.rep.Platform, rt.Runsc().String()
	touch := fmt.Sprintf("head -c %d /dev/urandom > /run/blob", o.TouchMiB<<20)
	for _, c := range []struct {
		name          string
		setup         string
		pause, resume *Timing
		fork          *Timing
	}{
		{"idle", "true", &rep.PauseIdle, &rep.ResumeIdle, &rep.ForkIdle},
		{fmt.Sprintf("%d MiB touched", o.TouchMiB), touch, &rep.PauseTouched, &rep.ResumeTouched, &rep.ForkTouched},
	} {
		ph.next(fmt.Sprintf("pause, resume and fork of %d, %s", o.ForkCount, c.name))
		if err := b.pauseAndFork(ctx, rt, c.setup, o.ForkCount, c.pause, c.resume, c.fork); err != nil {
			return rep, fmt.Errorf("bench pause (%s): %w", c.name, err)
		}
	}
	ph.next("runsc checkpoint and restore baseline")
	if err := b.checkpointBaseline(ctx, &rep); err != nil {
		return rep, fmt.Errorf("bench runsc checkpoint baseline: %w", err)
	}
	return rep, nil
}

// pauseAndFork times Pause and Resume of one sandbox prepared by the setup
// script, then forks of forkCount children of it, each fork's children
// destroyed before the next.
func (b *bencher) pauseAndFork(ctx context.Context, rt *gvisor.Runtime, setup string, forkCount int, pause, resume, fork *Timing) error {
	sb, err := rt.Create(ctx, b.spec("pause"))
	if err != nil {
		return err
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	if err := shell(ctx, sb, setup); err != nil {
		return err
	}
	var ps, rs, fs []time.Duration
	for range b.o.Iterations {
		start := time.Now()
		if err := rt.Pause(ctx, sb.ID()); err != nil {
			return err
		}
		ps = append(ps, time.Since(start))
		start = time.Now()
		if err := rt.Resume(ctx, sb.ID()); err != nil {
			return err
		}
		rs = append(rs, time.Since(start))
	}
	*pause, *resume = timing(ps), timing(rs)
	for range max(1, b.o.Iterations/2) {
		specs := make([]runtime.Spec, forkCount)
		for i := range specs {
			specs[i] = b.spec("child")
		}
		start := time.Now()
		kids, err := rt.Fork(ctx, sb.ID(), specs)
		if err != nil {
			return err
		}
		fs = append(fs, time.Since(start))
		for _, k := range kids {
			if err := shell(ctx, k, "test -e /run"); err != nil {
				return fmt.Errorf("a child does not answer: %w", err)
			}
			_ = k.Destroy(ctx)
		}
	}
	*fork = timing(fs)
	return shell(ctx, sb, "true") // the parent runs on
}

// shell runs script in sb and fails unless it exits 0.
func shell(ctx context.Context, sb runtime.Sandbox, script string) error {
	var errb strings.Builder
	res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stderr: &errb})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%q exited %d: %s", script, res.ExitCode, errb.String())
	}
	return nil
}

// checkpointBaseline times the bare `runsc checkpoint` of an idle container
// (sleep) of the same root filesystem, and its `runsc restore --detach`.
func (b *bencher) checkpointBaseline(ctx context.Context, rep *PauseReport) error {
	dir := filepath.Join(b.o.StateDir, "baseline")
	root := filepath.Join(dir, "runsc")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	defer gvisor.ReleaseRoot(root)
	if err := writeBundle(dir, b.o.Rootfs, []string{"/bin/sleep", "1000"}); err != nil {
		return err
	}
	runsc := func(args ...string) ([]byte, error) {
		return runscCmd(ctx, b.o.RunscPath, root, rep.Platform, args...).CombinedOutput()
	}
	detached := func(args ...string) error {
		return runscDetached(ctx, b.o.RunscPath, root, rep.Platform, filepath.Join(dir, "run.log"), args...)
	}
	var cs, rs []time.Duration
	for i := range b.o.Iterations {
		cid := fmt.Sprintf("baseline-%d", i)
		img := filepath.Join(dir, "image", cid)
		if err := os.MkdirAll(img, 0o700); err != nil {
			return err
		}
		if err := detached("run", "--detach", "--bundle", dir, cid); err != nil {
			return err
		}
		start := time.Now()
		if out, err := runsc("checkpoint", "--image-path", img, cid); err != nil {
			_, _ = runsc("delete", "--force", cid)
			return fmt.Errorf("runsc checkpoint: %w: %s", err, out)
		}
		cs = append(cs, time.Since(start))
		_, _ = runsc("delete", "--force", cid)
		start = time.Now()
		err := detached("restore", "--detach", "--image-path", img, "--bundle", dir, cid)
		rs = append(rs, time.Since(start))
		_, _ = runsc("delete", "--force", cid)
		if err != nil {
			return err
		}
	}
	rep.Baseline.Checkpoint, rep.Baseline.Restore = timing(cs), timing(rs)
	return nil
}
