package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Run keeps the node's sandboxes to their deadlines and its paused
// sandboxes to Settings.MaxPaused until ctx ends. Call Reconcile first.
// The node's membership of a cluster (registration, heartbeats, nodes
// declared down) is package membership's, which calls back StopAll,
// FailHostedBy and DestroyOrphans.
func (m *Manager) Run(ctx context.Context) error {
	go m.boundPauses(ctx)
	go m.keepPools(ctx)
	go m.measureUsage(ctx)
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			m.reap(ctx)
		}
	}
}

// reap stops the sandboxes of this node whose deadline has passed, or
// pauses those that asked for it (OnTimeoutPause).
func (m *Manager) reap(ctx context.Context) {
	expired, err := m.st.ListExpiredSandboxes(ctx, m.cfg.NodeID, m.now())
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("list expired sandboxes", "err", err)
		}
		return
	}
	for _, sb := range expired {
		go func() {
			ctx := context.WithoutCancel(ctx)
			if (sb.OnTimeout == store.OnTimeoutPause || sb.OnTimeout == store.OnTimeoutPauseFiles) && m.pauseAtDeadline(ctx, sb) {
				return
			}
			if err := m.stop(ctx, sb, store.ReasonTimeout); err != nil {
				m.log.Error("stop expired sandbox", "sandbox_id", sb.ID, "err", err)
			}
		}()
	}
}

// Reconcile makes the database and this node's runtime agree after a
// restart (or a crash): a row that says pending, running or stopping without
// a live sandbox becomes failed (or stopped, when it was stopping); a live
// sandbox without such a row is destroyed; runs that were executing when the
// process died are marked CRASHED, since their output stream is lost.
func (m *Manager) Reconcile(ctx context.Context) error {
	// States staged for a move by the last process (pausemove.go).
	if m.cfg.DataDir != "" {
		_ = os.RemoveAll(filepath.Join(m.cfg.DataDir, "moves"))
	}
	rows, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, activeStatuses...)
	if err != nil {
		return fmt.Errorf("list sandboxes of node: %w", err)
	}
	live, err := m.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("list runtime sandboxes: %w", err)
	}
	alive := map[string]bool{}
	for _, id := range live {
		alive[id] = true
	}
	keep := map[string]bool{}
	for _, sb := range rows {
		switch sb.Status {
		case store.SandboxRunning:
			if sb.PausedFiles {
				// Its files are saved: a pause of them alone caught
				// before its end is finished (what is left of its
				// runtime sandbox is destroyed as an orphan: it is not
				// kept), or one caught resuming is paused again.
				m.settleFilesPause(ctx, sb)
				continue
			}
			if sb.PausedState != "" && !alive[sb.ID] && (sb.Pause == store.PausePaused || sb.Pause == store.PauseResuming) {
				// Adopted from a node that went down, its state in the
				// blob store: paused until a resume restores it (one
				// cut short by a crash is paused again).
				if sb.Pause == store.PauseResuming {
					_ = m.ended(ctx, sb.ID)
					if _, err := m.st.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, store.PausePaused, m.now()); err != nil {
						m.log.Error("settle a resume from the blob store", "sandbox_id", sb.ID, "err", err)
					}
				}
				continue
			}
			if sb.Pause != "" && alive[sb.ID] {
				// Kept paused, or caught in the middle of a pause or a
				// resume: the row follows what the runtime has (paused,
				// running, or failed when it has nothing usable).
				m.settleAfterRuntime(ctx, sb.ID, sb.Pause)
				if cur, err := m.st.GetSandbox(ctx, sb.ID); err == nil && cur.Status == store.SandboxRunning {
					keep[sb.ID] = true
					if cur.Pause == "" {
						m.recover(ctx, cur)
					}
				}
				continue
			}
			if alive[sb.ID] {
				// Present is not enough: its processes may have died
				// with the host's (an OOM kill, a reboot that left the
				// state behind), and a stopped sandbox kept as running
				// would hold its account's place until its deadline.
				if rsb, err := m.rt.Get(ctx, sb.ID); err == nil {
					if st, err := rsb.State(ctx); err == nil && st == runtime.StateRunning {
						keep[sb.ID] = true
						m.recover(ctx, sb)
						continue
					}
					m.markGone(ctx, sb, "the sandbox had stopped when sandboxd restarted")
					continue
				}
			}
			m.markGone(ctx, sb, "the sandbox was gone after sandboxd restarted")
		case store.SandboxPending:
			m.markGone(ctx, sb, "sandboxd restarted while the sandbox was starting")
		case store.SandboxStopping:
			if err := m.finishStop(ctx, sb.ID, "stopped during restart"); err != nil {
				m.log.Error("finish stop after restart", "sandbox_id", sb.ID, "err", err)
			}
		}
	}
	m.destroyOrphans(ctx, live, keep)
	// What the hooks made for sandboxes that are gone (a crash leaves
	// namespaces, links and rules behind) goes too.
	m.reconcileHooks(ctx, func(id string) bool { return keep[id] })
	return m.runs.Reconcile(ctx)
}

// DestroyOrphans destroys this node's runtime sandboxes that no active row
// of this node stands for, and what the hooks made for them: after this
// node was declared down, what it hosted then was failed and must not be
// served again (membership's rejoin). Sandboxes started here since are
// kept.
func (m *Manager) DestroyOrphans(ctx context.Context) error {
	rows, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, activeStatuses...)
	if err != nil {
		return err
	}
	live, err := m.rt.List(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, sb := range rows {
		// A sandbox paused with its files alone has nothing here.
		keep[sb.ID] = !(sb.PausedFiles && sb.Pause == store.PausePaused)
	}
	m.destroyOrphans(ctx, live, keep)
	m.reconcileHooks(ctx, func(id string) bool { return keep[id] })
	return nil
}

// FailHostedBy fails what node id, declared down by membership, hosted:
// its active sandboxes become failed with reason (their keys revoked, by
// markFailed's hooks) and their executing runs CRASHED. It returns how
// many sandboxes it failed.
func (m *Manager) FailHostedBy(ctx context.Context, id, reason string) (int, error) {
	rows, err := m.st.ListSandboxesByNode(ctx, id, activeStatuses...)
	if err != nil {
		return 0, err
	}
	// Its sandboxes' volume leases go first, with the volumes' data
	// there: what was written since a volume's last sync is lost with the
	// node, and the volume is free at its last synced data as soon as its
	// writer is failed below.
	if lost, err := m.st.ReleaseVolumesOfNode(ctx, id); err != nil {
		m.log.Error("release the volumes of a node that went down", "node_id", id, "err", err)
	} else {
		for _, v := range lost {
			m.log.Warn("volume falls back to its last synced copy: its newest data was on a node that went down", "volume_id", v.ID, "name", v.Name, "node_id", id, "generation", v.Generation)
		}
	}
	gone := map[string]bool{}
	for _, sb := range rows {
		if sb.Movable() {
			// Its state is in the blob store: this node keeps it
			// paused and restores it from there at its resume.
			if ok, err := m.st.AdoptMovedPause(ctx, sb.ID, id, m.cfg.NodeID); err != nil || !ok {
				m.log.Warn("adopt a paused sandbox whose state is in the blob store", "sandbox_id", sb.ID, "node_id", id, "adopted", ok, "err", err)
			}
			continue
		}
		if sb.PausedFiles && sb.Status == store.SandboxRunning {
			// Nothing of it was on the node: this one keeps it paused
			// (its pause's time limit, its stop), and any node resumes
			// it.
			if ok, err := m.st.AdoptFilesPaused(ctx, sb.ID, id, m.cfg.NodeID); err != nil || !ok {
				m.log.Warn("adopt a sandbox paused with its files", "sandbox_id", sb.ID, "node_id", id, "adopted", ok, "err", err)
			}
			if cur, err := m.st.GetSandbox(ctx, sb.ID); err == nil {
				m.settleFilesPause(ctx, cur)
			}
			continue
		}
		m.markFailed(ctx, sb.ID, activeStatuses, reason)
		gone[sb.ID] = true
	}
	return len(rows), m.runs.CrashRunsOf(ctx, gone, "the command's sandbox was lost with its node: "+reason)
}

// destroyOrphans destroys the runtime sandboxes of live that keep does not
// name: no active row of this node stands for them.
func (m *Manager) destroyOrphans(ctx context.Context, live []string, keep map[string]bool) {
	for _, id := range live {
		if keep[id] {
			continue
		}
		rsb, err := m.rt.Get(ctx, id)
		if errors.Is(err, runtime.ErrNotFound) {
			continue
		}
		if err == nil {
			err = rsb.Destroy(ctx)
		}
		if err != nil {
			m.log.Error("destroy orphaned sandbox", "sandbox_id", id, "err", err)
			continue
		}
		_ = m.ended(ctx, id)
		m.log.Info("destroyed orphaned sandbox", "sandbox_id", id)
	}
}

func (m *Manager) markGone(ctx context.Context, sb store.Sandbox, reason string) {
	if rsb, err := m.rt.Get(ctx, sb.ID); err == nil {
		_ = rsb.Destroy(ctx)
	}
	m.markFailed(ctx, sb.ID, activeStatuses, reason)
	m.log.Warn("sandbox failed during reconcile", "sandbox_id", sb.ID, "reason", reason)
}

// pauseAtDeadline pauses an expired sandbox instead of stopping it, and
// reports whether it did; one that cannot be paused is stopped, as its
// deadline says. It gets the server's default lifetime first: that is what
// it has when resumed (with none left it would be paused again at once).
func (m *Manager) pauseAtDeadline(ctx context.Context, sb store.Sandbox) bool {
	if err := m.st.SetSandboxDeadline(ctx, sb.ID, m.now().Add(m.cfg.Settings.DefaultTimeout)); err != nil {
		m.log.Error("pause expired sandbox: set its lifetime after resume", "sandbox_id", sb.ID, "err", err)
		return false
	}
	sb.Deadline = m.now().Add(m.cfg.Settings.DefaultTimeout)
	pause := m.pause
	if sb.OnTimeout == store.OnTimeoutPauseFiles {
		pause = m.pauseFiles
	}
	if _, err := pause(ctx, sb); err != nil {
		m.log.Warn("pause expired sandbox: stopping it instead", "sandbox_id", sb.ID, "err", err)
		return false
	}
	m.log.Info("sandbox paused at its deadline", "sandbox_id", sb.ID, "account_id", sb.AccountID)
	return true
}

// pausedCheckEvery is how often a node looks for sandboxes paused past
// Settings.MaxPaused: the bound is days long, so a minute late is nothing,
// and the query need not run with every deadline tick.
const pausedCheckEvery = time.Minute

// boundPauses stops this node's sandboxes paused longer than
// Settings.MaxPaused until ctx ends: at once (a node back after a restart
// or a long stop catches up without waiting a period), then every
// pausedCheckEvery. The bound lives in the database (when each pause
// began), so nothing of it is lost with the process.
func (m *Manager) boundPauses(ctx context.Context) {
	if m.cfg.Settings.MaxPaused <= 0 {
		return
	}
	t := time.NewTicker(pausedCheckEvery)
	defer t.Stop()
	for {
		m.reapPaused(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reapPaused stops the sandboxes of this node that have been paused for
// longer than Settings.MaxPaused, their saved memory deleted with them:
// a paused sandbox's deadline does not run, and without a bound an
// account could keep its quota's worth of checkpoints on the node's disk
// for ever. Only the node hosting a sandbox touches it (its runtime holds
// what it saved); a node that is down has its sandboxes failed by the
// others (watchNodes).
func (m *Manager) reapPaused(ctx context.Context) {
	bound := m.cfg.Settings.MaxPaused
	if bound <= 0 {
		return
	}
	cutoff := m.now().Add(-bound)
	stale, err := m.st.ListPausedBefore(ctx, m.cfg.NodeID, cutoff)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn("list sandboxes paused too long", "err", err)
		}
		return
	}
	for _, sb := range stale {
		if err := m.stopPaused(context.WithoutCancel(ctx), sb, cutoff); err != nil {
			m.log.Error("stop sandbox paused too long", "sandbox_id", sb.ID, "err", err)
		}
	}
}

// stopPaused stops sandbox sb of this node if it is still paused since
// cutoff or before: one resumed meanwhile (or being resumed) is left alone.
func (m *Manager) stopPaused(ctx context.Context, sb store.Sandbox, cutoff time.Time) error {
	reason := fmt.Sprintf("paused for longer than the server allows (%v)", m.cfg.Settings.MaxPaused)
	ok, err := m.st.BeginStopPaused(ctx, sb.ID, cutoff, reason, m.now())
	if err != nil || !ok {
		return err
	}
	m.preKill(ctx, sb.ID)
	if err := m.finishStop(ctx, sb.ID, reason); err != nil {
		return err
	}
	m.log.Info("stopped a sandbox paused too long", "sandbox_id", sb.ID, "account_id", sb.AccountID, "max_paused", m.cfg.Settings.MaxPaused)
	return nil
}
