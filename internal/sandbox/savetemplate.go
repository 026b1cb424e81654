package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/snapshot"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// A running sandbox saved as a template (templates.Service.FromSandbox):
// the manager finds the sandbox under the one access rule and captures its
// writable layer with the runtime's Snapshot, as persistence captures an
// account's snapshot. Its memory is not saved.

// SandboxToSave implements templates.SandboxSaver: sandbox id, which p may
// act on and this node runs, when it can be saved: not a fork (its files
// are its parent's copied without the layers they sat on), and not while
// a run executes in it (409).
func (m *Manager) SandboxToSave(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, err
	}
	if !m.rt.Capabilities().AnyRootFS {
		return sb, errdefs.New(errdefs.ErrInvalid, "this server's runtime cannot start custom templates or snapshots")
	}
	switch {
	case sb.Status != store.SandboxRunning:
		return sb, errdefs.Newf(errdefs.ErrNotRunning, "sandbox %s is %s; only a running sandbox can be saved as a template or a snapshot", sb.ID, sb.Status)
	case sb.NodeID != m.cfg.NodeID:
		return sb, fmt.Errorf("sandbox %s is hosted on node %s: %w", sb.ID, sb.NodeID, errdefs.ErrNotRunning)
	case sb.ForkedFrom != "":
		return sb, errdefs.New(errdefs.ErrInvalid, "a forked sandbox cannot be saved as a template or a snapshot yet; save the sandbox it was forked from")
	}
	// A run's end captures the sandbox for the account's snapshot: the
	// two captures would freeze and thaw it under each other.
	return sb, m.refuseWhileRunExecutes(ctx, sb, "save")
}

// CaptureFiles implements templates.SandboxSaver: sb's writable layer, in
// the snapshot format, to w. A paused sandbox is resumed first (Local);
// the runtime quiesces a running one while it is written.
func (m *Manager) CaptureFiles(ctx context.Context, sb store.Sandbox, w io.Writer) (snapshot.Manifest, error) {
	cur, err := m.st.GetSandbox(ctx, sb.ID)
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("capture sandbox %s: %w", sb.ID, err)
	}
	if err := m.refuseWhileRunExecutes(ctx, cur, "save"); err != nil {
		return snapshot.Manifest{}, err
	}
	var rsb runtime.Sandbox
	if _, ok := m.filesPausing.Load(sb.ID); ok && cur.Pause == store.PausePausing {
		// The pause of its files alone saving them (pausefiles.go):
		// nothing else acts on it while its row says pausing.
		rsb, err = m.rt.Get(ctx, sb.ID)
	} else {
		rsb, err = m.Local(ctx, cur)
	}
	if err != nil {
		return snapshot.Manifest{}, errdefs.Wrap(errdefs.ErrNotRunning, err, fmt.Sprintf("sandbox %s stopped before it was saved", sb.ID))
	}
	man, err := rsb.Snapshot(ctx, w)
	switch {
	case errors.Is(err, snapshot.ErrTooLarge):
		return man, errdefs.Wrap(errdefs.ErrInvalid, err, errdefs.Message(err, "the sandbox's files are larger than a layer may be"))
	case errors.Is(err, runtime.ErrNotFound), errors.Is(err, runtime.ErrNotRunning):
		return man, errdefs.Wrap(errdefs.ErrNotRunning, err, fmt.Sprintf("sandbox %s stopped before it was saved", sb.ID))
	case err != nil:
		return man, fmt.Errorf("capture sandbox %s: %w", sb.ID, err)
	}
	return man, nil
}

var _ templates.SandboxSaver = (*Manager)(nil)
