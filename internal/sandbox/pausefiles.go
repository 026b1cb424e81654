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

// A pause of the files alone (REST's {"memory": false}, E2B's keepMemory
// false, the deadline's OnTimeoutPauseFiles): the sandbox's files are
// saved as an untagged snapshot in the blob store (templates'
// SavePausedFiles: the capture a named snapshot makes), which becomes its
// template; then its runtime sandbox is destroyed and what the hooks made
// for it ends (its key, its network). Nothing of it is left on its node,
// so a resume starts it again from its files on whichever node is asked
// (ClaimFilesResume), with the same id, access tokens, policy and
// remaining lifetime, a new key and its processes started afresh (the
// template's start command too). The row walks the pause states as a
// memory pause does; SetPausingFiles marks the point after which the
// pause is finished, never undone, also by Reconcile after a crash.

// FilesSaver saves a sandbox's files for a pause of its files alone
// (package templates' Service).
type FilesSaver interface {
	SavePausedFiles(ctx context.Context, sb store.Sandbox) (store.Template, error)
}

// SetFilesSaver gives the manager the service that saves files for a
// pause of the files alone (built after the manager, which it uses as its
// SandboxSaver). Without one such a pause is refused.
func (m *Manager) SetFilesSaver(s FilesSaver) { m.filesSaver = s }

// canPauseFiles refuses, with the reason, a pause of the files alone this
// server cannot do.
func (m *Manager) canPauseFiles(sb store.Sandbox) error {
	if m.filesSaver == nil || m.cfg.Templates == nil {
		return errdefs.New(errdefs.ErrInvalid, "this server cannot pause a sandbox's files alone (templates or the blob store are not enabled); pause it with its memory")
	}
	if !m.rt.Capabilities().AnyRootFS {
		return errdefs.Newf(errdefs.ErrInvalid, "the %s runtime of this server cannot start a sandbox again from saved files; pause it with its memory", m.rt.Name())
	}
	if sb.ForkedFrom != "" {
		return errdefs.New(errdefs.ErrNotRunning, "a forked sandbox's files cannot be saved yet, so it cannot be paused without its memory; pause it with its memory")
	}
	return nil
}

// pauseFiles pauses a running sandbox of this node with its files alone;
// one in a pause already is answered as it is.
func (m *Manager) pauseFiles(ctx context.Context, sb store.Sandbox) (_ store.Sandbox, err error) {
	defer func(start time.Time) { m.ops.observe(opPause, start, err) }(m.now())
	ctx = context.WithoutCancel(ctx)
	if done, err := pauseStarts(sb); done || err != nil {
		return sb, err
	}
	if err := m.canPauseFiles(sb); err != nil {
		return sb, err
	}
	if sb.NodeID != m.cfg.NodeID {
		return sb, fmt.Errorf("sandbox %s is hosted on node %s: %w", sb.ID, sb.NodeID, errdefs.ErrNotRunning)
	}
	if err := m.refuseWhileRunExecutes(ctx, sb, "pause"); err != nil {
		return sb, err
	}
	rsb, err := m.rt.Get(ctx, sb.ID)
	if err != nil {
		return sb, errors.Join(errdefs.ErrNotRunning, err)
	}
	// Its /workspace whole, as a save of its files sees it.
	_ = m.Prepare(ctx, sb, rsb, false)
	ok, err := m.st.BeginPause(ctx, sb.ID, m.now())
	if err != nil {
		return sb, err
	}
	if !ok {
		return m.settledPause(ctx, sb.ID)
	}
	m.filesPausing.Store(sb.ID, true)
	defer m.filesPausing.Delete(sb.ID)
	saved, err := m.filesSaver.SavePausedFiles(ctx, sb)
	if err != nil {
		// Nothing changed: it runs on.
		if _, terr := m.st.TransitionPause(ctx, sb.ID, []string{store.PausePausing}, "", m.now()); terr != nil {
			m.log.Error("undo a pause of files", "sandbox_id", sb.ID, "err", terr)
		}
		return sb, fmt.Errorf("pause sandbox %s: save its files: %w", sb.ID, err)
	}
	if ok, err := m.st.SetPausingFiles(ctx, sb.ID, saved.ID, m.now()); err != nil || !ok {
		// Stopped meanwhile (its stop destroys it): the saved files are
		// collected as any stray.
		if err == nil {
			return m.settledPause(ctx, sb.ID)
		}
		return sb, err
	}
	if err := m.finishFilesPause(ctx, sb.ID); err != nil {
		return sb, err
	}
	m.log.Info("sandbox paused with its files alone", "sandbox_id", sb.ID, "template_id", saved.ID)
	return m.st.GetSandbox(ctx, sb.ID)
}

// finishFilesPause ends a pause of sandbox id's files past
// SetPausingFiles: its runtime sandbox goes (on this node, when it is
// here), what the hooks made for it ends, and the row says paused.
func (m *Manager) finishFilesPause(ctx context.Context, id string) error {
	rsb, err := m.rt.Get(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrNotFound):
	case err != nil:
		m.log.Error("pause of files: attach to the sandbox to destroy it", "sandbox_id", id, "err", err)
	default:
		if err := rsb.Destroy(ctx); err != nil {
			// Its files are saved: the pause goes on, and what is
			// left of the runtime sandbox is an orphan Reconcile
			// destroys.
			m.log.Error("pause of files: destroy the sandbox", "sandbox_id", id, "err", err)
		}
	}
	if err := m.ended(ctx, id); err != nil {
		m.log.Error("pause of files: end what the sandbox held", "sandbox_id", id, "err", err)
	}
	if _, err := m.st.FinishFilesPause(ctx, id, m.now()); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// resumeFiles starts sandbox sb, whose resume this node has claimed
// (ClaimFilesResume), again from its saved files. A start that fails
// leaves it paused as it was, for another try.
func (m *Manager) resumeFiles(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	return m.resumeElsewhere(ctx, sb, "from its files", "it stays paused with its files", m.startFromFiles)
}

// resumeElsewhere ends the resume of sandbox sb this node has claimed
// (resuming) where its runtime sandbox is not here: place (from its files,
// from its state in the blob store) puts it on the runtime; a failure
// undoes what the hooks made and leaves it paused (kept says how, for the
// user), a success marks it running. how names the resume in the log.
func (m *Manager) resumeElsewhere(ctx context.Context, sb store.Sandbox, how, kept string, place func(context.Context, store.Sandbox) (runtime.Sandbox, string, error)) (store.Sandbox, error) {
	start := m.now()
	sb.NodeID, sb.Pause = m.cfg.NodeID, store.PauseResuming
	rsb, reason, err := place(ctx, sb)
	if err != nil {
		_ = m.ended(ctx, sb.ID)
		if _, terr := m.st.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, store.PausePaused, m.now()); terr != nil {
			m.log.Error("resume "+how+": back to paused", "sandbox_id", sb.ID, "err", terr)
		}
		m.log.Warn("resume "+how+" failed; the sandbox stays paused", "sandbox_id", sb.ID, "reason", reason, "err", err)
		return sb, errdefs.Wrap(nil, err, fmt.Sprintf("sandbox %s could not be resumed (%s); %s", sb.ID, reason, kept))
	}
	ok, err := m.st.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, "", m.now())
	if err != nil || !ok {
		// Stopped meanwhile: its stop found nothing here yet.
		_ = rsb.Destroy(ctx)
		_ = m.ended(ctx, sb.ID)
		if err == nil {
			err = errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s was stopped while it resumed", sb.ID)
		}
		return sb, err
	}
	m.log.Info("sandbox resumed "+how, "sandbox_id", sb.ID, "template_id", sb.TemplateID, "elapsed", m.now().Sub(start))
	return m.st.GetSandbox(ctx, sb.ID)
}

// startFromFiles places sandbox sb on the runtime from its template (its
// saved files) as start does a new one (place: a template's sandbox never
// restores the account's snapshot), without the row's status change: the
// hooks give it its key, network and environment again. reason is the
// user's words for a failure.
func (m *Manager) startFromFiles(ctx context.Context, sb store.Sandbox) (runtime.Sandbox, string, error) {
	release, err := m.admitDisk(ctx, 1)
	if err != nil {
		return nil, "its node has no disk for it", err
	}
	release()
	rsb, _, _, reason, err := m.place(ctx, &sb, "could not open its saved files")
	return rsb, reason, err
}

// settleFilesPause finishes what a crash (or the loss of its node) cut
// short for sandbox sb, paused with its files alone: a pause past
// SetPausingFiles ends paused; a resume under way on a node that is gone
// or restarted is paused again (its runtime sandbox, if any, is an orphan
// its node destroys).
func (m *Manager) settleFilesPause(ctx context.Context, sb store.Sandbox) {
	var err error
	switch sb.Pause {
	case store.PausePausing:
		if sb.NodeID == m.cfg.NodeID {
			err = m.finishFilesPause(ctx, sb.ID)
		} else {
			_, err = m.st.FinishFilesPause(ctx, sb.ID, m.now())
		}
	case store.PauseResuming:
		_ = m.ended(ctx, sb.ID)
		_, err = m.st.TransitionPause(ctx, sb.ID, []string{store.PauseResuming}, store.PausePaused, m.now())
	}
	if err != nil {
		m.log.Error("settle a pause of files", "sandbox_id", sb.ID, "pause", sb.Pause, "err", err)
	}
}
