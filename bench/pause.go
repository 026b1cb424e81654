package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/sandbox"
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
	// A cluster's pause also saves the paused sandbox's state to the blob
	// store (SaveMovable, packed, stored; after the pause above), and
	// another node restores it from there (fetched, unpacked,
	// RestoreMoved on another runtime, until its agent answers): the blob
	// store on this disk, as a single node's.
	SaveIdle       Timing   `json:"save_to_blob_store_idle"`
	SaveTouched    Timing   `json:"save_to_blob_store_touched"`
	RestoreIdle    Timing   `json:"restore_from_blob_store_idle"`
	RestoreTouched Timing   `json:"restore_from_blob_store_touched"`
	StateBytes     [2]int64 `json:"state_bytes"` // the stored state, idle and touched

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
	ph := startPhases(progress.Or(o.Progress), "bench pause", 5)
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
	other, err := b.newRuntime(ctx, "other-node", 0)
	if err != nil {
		return rep, err
	}
	defer other.Close()
	blobs, err := blob.NewLocal(filepath.Join(o.StateDir, "blobs"))
	if err != nil {
		return rep, err
	}
	mv := mover{from: rt, to: other, blobs: blobs, dir: filepath.Join(o.StateDir, "moves"), maxBytes: limits.DiskBytes + 2*limits.MemoryBytes + 256<<20}
	for i, c := range []struct {
		name          string
		setup         string
		pause, resume *Timing
		fork          *Timing
		save, restore *Timing
	}{
		{"idle", "true", &rep.PauseIdle, &rep.ResumeIdle, &rep.ForkIdle, &rep.SaveIdle, &rep.RestoreIdle},
		{fmt.Sprintf("%d MiB touched", o.TouchMiB), touch, &rep.PauseTouched, &rep.ResumeTouched, &rep.ForkTouched, &rep.SaveTouched, &rep.RestoreTouched},
	} {
		ph.next(fmt.Sprintf("pause, resume and fork of %d, %s", o.ForkCount, c.name))
		if err := b.pauseAndFork(ctx, rt, c.setup, o.ForkCount, c.pause, c.resume, c.fork); err != nil {
			return rep, fmt.Errorf("bench pause (%s): %w", c.name, err)
		}
		ph.next(fmt.Sprintf("a pause's state to the blob store and restored on another node, %s", c.name))
		if rep.StateBytes[i], err = b.moves(ctx, mv, c.setup, c.save, c.restore); err != nil {
			return rep, fmt.Errorf("bench pause, moved (%s): %w", c.name, err)
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

// mover moves paused sandboxes of one runtime to another through a blob
// store, as package sandbox does between a cluster's nodes.
type mover struct {
	from, to *gvisor.Runtime
	blobs    blob.Store
	dir      string
	maxBytes int64
}

// moves times, for a sandbox prepared by setup, paused each time (not
// timed): its state saved to the blob store, then its restore on the other
// runtime from there until its agent answers. It answers the state's
// stored size.
func (b *bencher) moves(ctx context.Context, mv mover, setup string, save, restore *Timing) (int64, error) {
	sb, err := mv.from.Create(ctx, b.spec("move"))
	if err != nil {
		return 0, err
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	if err := shell(ctx, sb, setup); err != nil {
		return 0, err
	}
	var ss, rs []time.Duration
	var size int64
	for range b.o.Iterations {
		if err := mv.from.Pause(ctx, sb.ID()); err != nil {
			return 0, err
		}
		start := time.Now()
		key, n, err := mv.save(ctx, sb.ID())
		if err != nil {
			return 0, err
		}
		ss, size = append(ss, time.Since(start)), n
		if err := mv.from.Resume(ctx, sb.ID()); err != nil {
			return 0, err
		}
		start = time.Now()
		moved, err := mv.restore(ctx, key, b.spec("moved"))
		if err != nil {
			return 0, err
		}
		if err := shell(ctx, moved, "test -e /run"); err != nil {
			return 0, fmt.Errorf("the restored sandbox does not answer: %w", err)
		}
		rs = append(rs, time.Since(start))
		_ = moved.Destroy(ctx)
		_ = mv.blobs.Delete(ctx, key)
	}
	*save, *restore = timing(ss), timing(rs)
	return size, nil
}

// save writes paused sandbox id's state to the blob store.
func (mv mover) save(ctx context.Context, id string) (string, int64, error) {
	if err := os.MkdirAll(mv.dir, 0o700); err != nil {
		return "", 0, err
	}
	dir, err := os.MkdirTemp(mv.dir, "save-")
	if err != nil {
		return "", 0, err
	}
	defer os.RemoveAll(dir)
	if err := mv.from.SaveMovable(ctx, id, dir); err != nil {
		return "", 0, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(sandbox.PackState(pw, dir)) }()
	info, err := mv.blobs.Put(ctx, pr)
	pr.Close()
	return info.Key, info.Size, err
}

// restore makes spec on the other runtime from the state key.
func (mv mover) restore(ctx context.Context, key string, spec runtime.Spec) (runtime.Sandbox, error) {
	dir, err := os.MkdirTemp(mv.dir, "restore-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rc, err := mv.blobs.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	err = sandbox.UnpackState(rc, dir, sandbox.StateLimits(mv.maxBytes))
	rc.Close()
	if err != nil {
		return nil, err
	}
	return mv.to.RestoreMoved(ctx, spec, dir)
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
