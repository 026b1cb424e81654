package microvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// Fork from a memory snapshot. The parent is parked (its memory saved as
// for a pause, QEMU ended), its layer disk copied while nothing writes to
// it, and it is restored from that memory at once; each child is then made
// the way a sandbox is made from a template: a copy of the disk, QEMU
// started from the saved memory, the parked agent's hello answered, the
// clock set and fresh entropy given. The parent is stopped for a park and
// a restore (QEMU's outgoing migration could also let it run on with
// `cont`; the park and restore are the paths pause and templates already
// prove).

var _ runtime.Forker = (*Runtime)(nil)

// Fork implements runtime.Forker.
func (r *Runtime) Fork(ctx context.Context, parentID string, children []runtime.Spec) ([]runtime.Sandbox, error) {
	p, err := r.get(parentID)
	if err != nil {
		return nil, err
	}
	return host.ForkSaved(ctx, r.Base, &p.Attachment, children, func(pm meta) host.Forking[*sandbox] {
		// The children are restored from the parent's memory and disk
		// as from a template's.
		tp := &template{Key: "fork-" + pm.CID, BaseDir: pm.BaseDir, Limits: pm.Limits, Hostname: pm.Hostname, VM: pm.VM, Layers: pm.Layers, Linked: pm.Network != nil,
			dir: p.Path("fork"), mem: p.Path("memory.state")}
		return host.Forking[*sandbox]{
			Save: func(ctx context.Context) error { return p.saveForFork(ctx, tp) },
			Start: func(ctx context.Context, spec runtime.Spec) (*sandbox, error) {
				return r.createFromTemplate(ctx, spec, r.Table().Dir.Path(spec.ID), tp)
			},
			Done: func() {
				_ = os.RemoveAll(tp.dir)
				if !p.Meta().Paused {
					_ = os.Remove(tp.mem) // the children are made: it is of no more use
				}
			},
		}
	})
}

// saveForFork parks the running VM (its memory where Resume looks for it,
// tp's memory file) and copies its disk into tp, then restores it; callers
// hold OpMu. From the park until the restore its meta says paused, so a
// restore that fails, or a crash of sandboxd meanwhile, leaves it paused
// with its memory: nothing of it is lost.
func (s *sandbox) saveForFork(ctx context.Context, tp *template) error {
	if st, err := s.State(ctx); err != nil {
		return err
	} else if st != runtime.StateRunning {
		return fmt.Errorf("%w (%s)", runtime.ErrNotRunning, st)
	}
	_ = os.RemoveAll(tp.dir) // an earlier fork's that did not finish
	if err := os.MkdirAll(tp.dir, 0o700); err != nil {
		return err
	}
	h, err := s.park(ctx, tp.state())
	if err != nil {
		return s.unpark(ctx, err)
	}
	tp.Hello = h
	if err := s.SetMeta(func(m *meta) { m.Paused, m.Hello = true, h }); err != nil {
		return s.pausedAfterFork(err)
	}
	copyErr := host.CopySparse(s.jail("disk", "layer.ext4"), tp.layer(), 0o600)
	// The parent runs again whatever the copy did.
	f, err := os.Open(tp.state())
	if err != nil {
		return errors.Join(copyErr, s.pausedAfterFork(err))
	}
	defer f.Close()
	if err := s.boot(ctx, &restoreFrom{state: f, hello: h, linked: s.Meta().Network != nil}); err != nil {
		return errors.Join(copyErr, s.pausedAfterFork(err))
	}
	return copyErr
}

// pausedAfterFork leaves a parent whose restore failed (err) paused, as
// Pause would have, and says so.
func (s *sandbox) pausedAfterFork(err error) error {
	m := s.Meta()
	_ = killWait(m.PID, m.PIDStart, 5*time.Second)
	s.Detach()
	if merr := s.leaveParked(m.Hello); merr != nil {
		return errors.Join(err, merr)
	}
	return fmt.Errorf("the parent could not run again after its memory was saved, so it is paused with it: %w", err)
}

// unpark serves a VM again after a park that failed (err) while QEMU still
// runs: the VM runs on, its logs and agent session are taken up again.
func (s *sandbox) unpark(ctx context.Context, err error) error {
	m := s.Meta()
	if !alive(m.PID, m.PIDStart) {
		return err
	}
	mon, merr := dialMonitor(ctx, s.jail(strings.TrimPrefix(jailQMP, "/")))
	if merr != nil {
		return errors.Join(err, merr)
	}
	defer mon.close()
	if st, serr := mon.status(ctx); serr == nil && st != "running" {
		if cerr := mon.cont(ctx); cerr != nil {
			return errors.Join(err, cerr)
		}
	}
	s.startLogs(m.PID, m.PIDStart)
	s.attach()
	return err
}
