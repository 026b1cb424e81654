package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// MaxForkCount bounds the children of one fork: each is a whole sandbox,
// restored from the parent's memory one or two at a time.
const MaxForkCount = 20

// A fork starts new sandboxes of the parent's account from a running
// sandbox's memory and filesystem at one moment (runtime.Forker). The
// children are sandboxes like any other: rows inserted together within the
// account's and the node's quotas (all or none), each with its own key
// (the processes copied from the parent keep the parent's in their
// environment; those the child starts get its own), network namespace
// under the parent's policy, lifetime and deadline. Their row records the
// parent (ForkedFrom) and the snapshot the parent started from; their
// /workspace is the parent's as it was, not prepared again.

// fork starts count children of the running sandbox parent, each living
// lifetime (0: the default), and returns their rows, running.
func (m *Manager) fork(ctx context.Context, parent store.Sandbox, count int, lifetime time.Duration) (_ []store.Sandbox, err error) {
	defer func(start time.Time) { m.ops.observe(opFork, start, err) }(time.Now())
	ctx = context.WithoutCancel(ctx) // children half made are worse than a late answer
	f, ok := m.rt.(runtime.Forker)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrInvalid, "the %s runtime of this server cannot fork sandboxes", m.rt.Name())
	}
	if count < 1 || count > MaxForkCount {
		return nil, errdefs.Newf(errdefs.ErrInvalid, "count must be between 1 and %d", MaxForkCount)
	}
	if lifetime <= 0 {
		lifetime = m.cfg.Settings.DefaultTimeout
	}
	if lifetime > m.cfg.Settings.MaxTimeout {
		return nil, errdefs.Newf(errdefs.ErrInvalid, "timeout must be at most %d ms", m.cfg.Settings.MaxTimeout.Milliseconds())
	}
	if vols, err := m.st.SandboxVolumes(ctx, parent.ID); err != nil {
		return nil, err
	} else if len(vols) > 0 {
		// A child would write the parent's volume beside it, or hold
		// a copy of a disk its parent goes on changing.
		return nil, errdefs.New(errdefs.ErrConflict, "a sandbox with volumes cannot be forked: fork its volumes (POST /api/volumes/{name}/fork) and create sandboxes on the copies")
	}
	if _, err := m.Local(ctx, parent); err != nil { // a paused parent is resumed first
		return nil, err
	}
	if err := m.refuseWhileRunExecutes(ctx, parent, "fork"); err != nil {
		return nil, err
	}
	// The children copy /workspace as it is: it is readied first, so
	// that none starts half cloned (a failed preparation is the
	// parent's, copied as it is). A fork the runtime cannot do now is
	// refused here, before any child's row exists.
	if err := m.readyForSave(ctx, parent, "forked"); err != nil {
		return nil, err
	}
	now := m.now()
	kids := make([]*store.Sandbox, count)
	for i := range kids {
		kids[i] = &store.Sandbox{
			ID: store.NewID("sbx_"), AccountID: parent.AccountID, NodeID: m.cfg.NodeID,
			Status: store.SandboxPending, Runtime: m.rt.Name(), Network: parent.Network,
			SnapshotID: parent.SnapshotID, ForkedFrom: parent.ID, TemplateID: parent.TemplateID,
			CreatedAt: now, UpdatedAt: now, Deadline: now.Add(lifetime),
		}
	}
	// The parent's saved state needs room on this node's disk until the
	// children are made from it, and each child its disk: the one
	// reserved first, the others admitted beside it. A refusal leaves the
	// parent running as it was.
	done, err := m.admitSave(ctx, parent.ID, "fork", m.forkSaveBytes(ctx, parent.ID))
	if err != nil {
		return nil, err
	}
	defer done()
	release, err := m.admitDisk(ctx, count)
	if err != nil {
		return nil, err
	}
	err = m.st.CreateSandboxesWithin(ctx, kids, m.sandboxLimits(0))
	release()
	if err != nil {
		return nil, quotaError(err)
	}
	return m.startForked(ctx, f, parent, kids)
}

// startForked has the runtime make the children whose rows are pending,
// and marks them running, or all failed with the reason.
func (m *Manager) startForked(ctx context.Context, f runtime.Forker, parent store.Sandbox, kids []*store.Sandbox) ([]store.Sandbox, error) {
	fail := func(reason string, err error) ([]store.Sandbox, error) {
		for _, k := range kids {
			m.markFailed(ctx, k.ID, []store.SandboxStatus{store.SandboxPending}, reason)
		}
		return nil, forkError(parent.ID, reason, err)
	}
	specs := make([]runtime.Spec, len(kids))
	for i, k := range kids {
		specs[i] = m.baseSpec(*k)
		if reason, err := m.prestart(ctx, *k, &specs[i]); err != nil {
			return fail(reason, err)
		}
	}
	start := m.now()
	made, err := f.Fork(ctx, parent.ID, specs)
	if err != nil {
		// The parent may have been left paused (or lost) by a failed save.
		m.settleParent(ctx, parent.ID)
		return fail("the runtime could not fork its parent", err)
	}
	destroyAll := func() {
		for _, rsb := range made {
			_ = rsb.Destroy(ctx)
		}
	}
	out := make([]store.Sandbox, len(kids))
	for i, k := range kids {
		if reason, err := m.poststart(ctx, k, made[i], false); err != nil {
			destroyAll()
			return fail(reason, err)
		}
		ok, err := m.st.TransitionSandbox(ctx, k.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", m.now())
		if err != nil || !ok {
			destroyAll()
			if err == nil {
				err = errors.New("sandbox left pending while starting")
			}
			return fail("its state changed while starting", err)
		}
		k.Status, k.UpdatedAt = store.SandboxRunning, m.now()
		out[i] = *k
	}
	m.log.Info("sandbox forked", "sandbox_id", parent.ID, "account_id", parent.AccountID, "children", len(kids), "elapsed", m.now().Sub(start))
	return out, nil
}

// settleParent makes the parent's row follow what a failed fork left of it
// on the runtime: running, paused with its memory (a microVM whose restore
// failed), or gone.
func (m *Manager) settleParent(ctx context.Context, id string) {
	st := runtime.StateStopped
	rsb, err := m.rt.Get(ctx, id)
	if err == nil {
		if s, serr := rsb.State(ctx); serr == nil {
			st = s
		}
	}
	switch st {
	case runtime.StateRunning:
	case runtime.StatePaused:
		// As a pause would have: its deadline clock stops.
		if ok, _ := m.st.BeginPause(ctx, id, m.now()); ok {
			m.settleAfterRuntime(ctx, id, store.PausePausing)
		}
	default:
		if err == nil {
			_ = rsb.Destroy(ctx)
		}
		m.markFailed(ctx, id, []store.SandboxStatus{store.SandboxRunning}, "the sandbox was lost while it was forked")
	}
}

// forkError is a failed fork's error: a refusal the runtime explains
// (ErrCannotPause: TCP sockets in use on an old gVisor) keeps its reason for the user, as a
// pause's does.
func forkError(parentID, reason string, err error) error {
	if why, ok := cannotSaveReason(err); ok {
		return errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s cannot be forked now: %s", parentID, why)
	}
	if errors.Is(err, runtime.ErrNotRunning) {
		return fmt.Errorf("fork sandbox %s: %w", parentID, errors.Join(errdefs.ErrNotRunning, err))
	}
	return fmt.Errorf("fork sandbox %s: %s: %w", parentID, reason, err)
}
