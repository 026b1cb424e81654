package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// deleteEnded removes an ended (stopped or failed) sandbox now, with its keys
// and E2B record: what the retention sweep does once it is old enough
// (--keep-stopped-sandboxes). A live sandbox must be stopped first, and
// one a queued or executing run still names is kept for its run; both are
// refused with a reason. Deleting one that is already gone is not an error.
func (m *Manager) deleteEnded(ctx context.Context, sb store.Sandbox) error {
	if sb.Status != store.SandboxStopped && sb.Status != store.SandboxFailed {
		return errdefs.Newf(errdefs.ErrNotRunning, "Sandbox is %s: stop it before deleting it", statusWord(sb))
	}
	ok, err := m.st.DeleteEndedSandbox(ctx, sb.ID)
	if err != nil || ok {
		return err
	}
	// Something kept it: say what, as it is now.
	now, err := m.st.GetSandbox(ctx, sb.ID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("get sandbox %s: %w", sb.ID, err)
	case now.Status != store.SandboxStopped && now.Status != store.SandboxFailed:
		return errdefs.Newf(errdefs.ErrNotRunning, "Sandbox is %s: stop it before deleting it", statusWord(now))
	}
	return errdefs.New(errdefs.ErrNotRunning, "Sandbox is still named by a run that has not finished; it can be deleted once the run ends")
}

// statusWord is a sandbox's status as its API object shows it (a pause's
// step: pausing, paused, resuming).
func statusWord(sb store.Sandbox) string {
	if sb.Status == store.SandboxRunning && sb.Pause != "" {
		return sb.Pause
	}
	return string(sb.Status)
}
