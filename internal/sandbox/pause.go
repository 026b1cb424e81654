package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A pause keeps a running sandbox whole on its node (memory, processes,
// filesystem; runtime.Pauser) while nothing of it runs. The row stays
// running (the sandbox keeps its place in the quotas, its key and its
// disk); its pause column walks "" → pausing → paused → resuming → "",
// each step a compare-and-set before the runtime acts, and its deadline
// does not run while it is paused (for at most Settings.MaxPaused:
// reapPaused). Its checkpoint is admitted on the node's disk (admitSave). Exec, files, ports, processes and the
// port proxy resume a paused sandbox first (Local, GuestAddr); stop
// destroys it as it is. A pause the runtime cannot do now is refused
// before anything changes (readyForSave), and one that fails leaves the
// row as the runtime left the sandbox (settleAfterRuntime).

// resumeWait bounds how long a call waits for another caller's resume.
const resumeWait = 2 * time.Minute

// pauser is the runtime's Pauser, or a clear refusal.
func (m *Manager) pauser() (runtime.Pauser, error) {
	p, ok := m.rt.(runtime.Pauser)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrInvalid, "the %s runtime of this server cannot pause sandboxes", m.rt.Name())
	}
	return p, nil
}

// pause saves a running sandbox of this node whole and stops it running;
// pausing a paused sandbox answers it as it is.
func (m *Manager) pause(ctx context.Context, sb store.Sandbox) (_ store.Sandbox, err error) {
	defer func(start time.Time) { m.ops.observe(opPause, start, err) }(time.Now())
	ctx = context.WithoutCancel(ctx) // half a pause is worse than a late answer
	p, err := m.pauser()
	if err != nil {
		return sb, err
	}
	if done, err := pauseStarts(sb); done || err != nil {
		return sb, err
	}
	if sb.NodeID != m.cfg.NodeID {
		return sb, fmt.Errorf("sandbox %s is hosted on node %s: %w", sb.ID, sb.NodeID, errdefs.ErrNotRunning)
	}
	// A run's command would be frozen with it, and its follower cut off.
	if err := m.refuseWhileRunExecutes(ctx, sb, "pause"); err != nil {
		return sb, err
	}
	// sandboxd's own work in it first (see readyForSave).
	if err := m.readyForSave(ctx, sb, "paused"); err != nil {
		return sb, err
	}
	// Its checkpoint needs room on this node's disk, reserved before the
	// row or the runtime change: a refusal leaves it running as it was.
	done, err := m.admitSave(ctx, sb.ID, "pause", m.saveBytes(ctx, sb.ID))
	if err != nil {
		return sb, err
	}
	defer done()
	ok, err := m.st.BeginPause(ctx, sb.ID, m.now())
	if err != nil {
		return sb, err
	}
	if !ok {
		return m.settledPause(ctx, sb.ID)
	}
	start := m.now()
	if err := p.Pause(ctx, sb.ID); err != nil {
		// Whatever the runtime left, the row follows it.
		m.settleAfterRuntime(ctx, sb.ID, store.PausePausing)
		if why, ok := cannotSaveReason(err); ok {
			return sb, errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s cannot be paused now: %s", sb.ID, why)
		}
		return sb, fmt.Errorf("pause sandbox %s: %w", sb.ID, err)
	}
	if _, err := m.st.TransitionPause(ctx, sb.ID, []string{store.PausePausing}, store.PausePaused, m.now()); err != nil {
		return sb, err
	}
	// In a cluster its state goes to the blob store too (pausemove.go).
	m.savePausedState(ctx, sb)
	m.log.Info("sandbox paused", "sandbox_id", sb.ID, "elapsed", m.now().Sub(start))
	return m.st.GetSandbox(ctx, sb.ID)
}

// pauseStarts says whether a pause of sb may begin: done for one in a
// pause already (answered as it is), an error for one not running or
// resuming.
func pauseStarts(sb store.Sandbox) (done bool, err error) {
	if sb.Status != store.SandboxRunning {
		return false, errdefs.ErrNotRunning
	}
	switch sb.Pause {
	case store.PausePaused, store.PausePausing:
		return true, nil
	case store.PauseResuming:
		return false, errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s is resuming; pause it once it runs", sb.ID)
	}
	return false, nil
}

// readyForSave readies a running sandbox of this node to be saved (what:
// "paused", "forked"), before anything is reserved or changed for it.
// sandboxd's own work in it ends first: the preparation of its
// /workspace, which a create starts in the background (a clone over a
// connection to sandboxd.internal), so that a save never cuts it off nor
// is refused over its socket. Then the runtime says whether it could save
// the sandbox now (runtime.SaveChecker): its refusal is a 409 with its
// reason, the sandbox running on as it was.
func (m *Manager) readyForSave(ctx context.Context, sb store.Sandbox, what string) error {
	rsb, err := m.rt.Get(ctx, sb.ID)
	if err != nil {
		if errors.Is(err, runtime.ErrNotFound) {
			return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotRunning)
		}
		return err
	}
	// Its failure is the preparation's to report (the sandbox is saved
	// with /workspace as it is, as a fork copies it).
	_ = m.Prepare(ctx, sb, rsb, false)
	c, ok := m.rt.(runtime.SaveChecker)
	if !ok {
		return nil
	}
	err = c.CheckSave(ctx, sb.ID)
	if why, refused := cannotSaveReason(err); refused {
		return errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s cannot be %s now: %s", sb.ID, what, why)
	}
	if errors.Is(err, runtime.ErrNotRunning) || errors.Is(err, runtime.ErrNotFound) {
		return fmt.Errorf("sandbox %s: %w", sb.ID, errors.Join(errdefs.ErrNotRunning, err))
	}
	if err != nil {
		return fmt.Errorf("check that sandbox %s can be %s: %w", sb.ID, what, err)
	}
	return nil
}

// cannotSaveReason is the runtime's reason, after the class's words, when
// err is its refusal to save a sandbox now (runtime.ErrCannotPause, for a
// pause or a fork): the user's to read.
func cannotSaveReason(err error) (string, bool) {
	if !errors.Is(err, runtime.ErrCannotPause) {
		return "", false
	}
	_, why, _ := strings.Cut(err.Error(), runtime.ErrCannotPause.Error()+": ")
	return why, true
}

// refuseWhileRunExecutes refuses (409) to do what to sb while a run
// executes in it: a pause or a fork ends the host's session with the
// sandbox's agent, which the run's follower is on.
func (m *Manager) refuseWhileRunExecutes(ctx context.Context, sb store.Sandbox, what string) error {
	executing, err := m.st.ListRunsByStatus(ctx, store.RunExecuting)
	if err != nil {
		return fmt.Errorf("%s sandbox %s: %w", what, sb.ID, err)
	}
	for _, r := range executing {
		if r.SandboxID == sb.ID {
			return errdefs.Newf(errdefs.ErrNotRunning, "run %s is executing in sandbox %s; %s it when the run has ended", r.ID, sb.ID, what)
		}
	}
	return nil
}

// settledPause answers a sandbox another caller is pausing or has paused
// (or stopped) meanwhile.
func (m *Manager) settledPause(ctx context.Context, id string) (store.Sandbox, error) {
	cur, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return cur, err
	}
	if cur.Status != store.SandboxRunning {
		return cur, errdefs.ErrNotRunning
	}
	return cur, nil
}

// resumeSandbox brings a paused sandbox of this node back; resuming a running
// sandbox answers it as it is, and one another caller is resuming is
// waited for.
func (m *Manager) resumeSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	ctx = context.WithoutCancel(ctx)
	if sb.Status != store.SandboxRunning {
		return sb, errdefs.ErrNotRunning
	}
	if sb.NodeID != m.cfg.NodeID && !sb.FilesPaused() {
		return sb, fmt.Errorf("sandbox %s is hosted on node %s: %w", sb.ID, sb.NodeID, errdefs.ErrNotRunning)
	}
	deadline := time.Now().Add(resumeWait)
	var err error
	for {
		switch {
		case sb.Pause == "":
			return sb, nil
		case sb.FilesPaused():
			// Its files are in the blob store: this node starts it.
			ok, err := m.st.ClaimFilesResume(ctx, sb.ID, m.cfg.NodeID, m.now())
			if err != nil {
				return sb, err
			}
			if ok {
				return m.resumeFiles(ctx, sb)
			}
		case sb.Pause == store.PausePaused:
			p, err := m.pauser()
			if err != nil {
				return sb, err
			}
			ok, err := m.st.TransitionPause(ctx, sb.ID, []string{store.PausePaused}, store.PauseResuming, m.now())
			if err != nil {
				return sb, err
			}
			if ok && m.movedHere(ctx, sb) {
				// Adopted from a node that went down: its state is
				// in the blob store.
				return m.resumeMoved(ctx, sb)
			}
			if ok {
				return m.resume(ctx, p, sb)
			}
		}
		// Another caller is pausing or resuming it: wait for its end.
		if time.Now().After(deadline) {
			return sb, errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s is still %s", sb.ID, sb.Pause)
		}
		time.Sleep(50 * time.Millisecond)
		if sb, err = m.st.GetSandbox(ctx, sb.ID); err != nil {
			return sb, err
		}
		if sb.Status != store.SandboxRunning {
			return sb, errdefs.ErrNotRunning
		}
	}
}

// resume does the runtime's part of a resume this caller has claimed.
func (m *Manager) resume(ctx context.Context, p runtime.Pauser, sb store.Sandbox) (store.Sandbox, error) {
	start := m.now()
	if err := p.Resume(ctx, sb.ID); err != nil {
		m.settleAfterRuntime(ctx, sb.ID, store.PauseResuming)
		return sb, fmt.Errorf("resume sandbox %s: %w", sb.ID, err)
	}
	if _, err := m.st.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, "", m.now()); err != nil {
		return sb, err
	}
	// Resumed: its state in the blob store, if any, is of no more use.
	m.collectPausedState(ctx, sb.PausedState)
	m.log.Info("sandbox resumed", "sandbox_id", sb.ID, "elapsed", m.now().Sub(start))
	return m.st.GetSandbox(ctx, sb.ID)
}

// settleAfterRuntime makes a row caught in a pause state (from: pausing or
// resuming, after a failed runtime call or a crash) say what the runtime
// has: running, paused, or — when the sandbox is gone — failed.
func (m *Manager) settleAfterRuntime(ctx context.Context, id, from string) {
	st := runtime.StateStopped
	rsb, gerr := m.rt.Get(ctx, id)
	if gerr == nil {
		if s, err := rsb.State(ctx); err == nil {
			st = s
		}
	}
	var err error
	switch st {
	case runtime.StateRunning:
		_, err = m.st.TransitionPause(ctx, id, []string{from}, "", m.now())
	case runtime.StatePaused:
		_, err = m.st.TransitionPause(ctx, id, []string{from}, store.PausePaused, m.now())
	default:
		reason := "the sandbox was lost while it paused"
		if from == store.PauseResuming {
			reason = "the sandbox could not be resumed"
		}
		if gerr == nil {
			_ = rsb.Destroy(ctx)
		}
		m.markFailed(ctx, id, []store.SandboxStatus{store.SandboxRunning}, reason)
	}
	if err != nil {
		m.log.Error("settle a sandbox's pause", "sandbox_id", id, "err", err)
	}
}

// awake resumes sb first when it is in a pause (calls that touch a sandbox
// wake it) and returns its row as it is then.
func (m *Manager) awake(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	if sb.Status != store.SandboxRunning || sb.Pause == "" {
		return sb, nil
	}
	if sb.Pause == store.PausePausing {
		return sb, errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s is pausing; resume it once it is paused", sb.ID)
	}
	return m.resumeSandbox(ctx, sb)
}

// setPausedTimeout sets the lifetime a paused sandbox gets at resume.
func (m *Manager) setPausedTimeout(ctx context.Context, sb store.Sandbox, d time.Duration) (store.Sandbox, error) {
	ok, err := m.st.SetPausedRemaining(ctx, sb.ID, d)
	if err != nil {
		return sb, err
	}
	if !ok {
		return sb, errors.Join(errdefs.ErrNotRunning, fmt.Errorf("sandbox %s left its pause meanwhile; try again", sb.ID))
	}
	return m.st.GetSandbox(ctx, sb.ID)
}
