package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// processes lists the processes started in a running sandbox (by exec
// and runs) that still run.
func (m *Manager) processes(ctx context.Context, sb store.Sandbox) ([]runtime.Process, error) {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return nil, err
	}
	ps, err := rsb.Processes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list processes of %s: %w", sb.ID, err)
	}
	return ps, nil
}

// signalProcess sends sig to process pid of a running sandbox and to
// everything it started.
func (m *Manager) signalProcess(ctx context.Context, sb store.Sandbox, pid int, sig syscall.Signal) error {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return err
	}
	if err := rsb.SignalProcess(ctx, pid, sig); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errdefs.Newf(errdefs.ErrNotFound, "no process %d runs in sandbox %s", pid, sb.ID)
		}
		return fmt.Errorf("signal process %d of %s: %w", pid, sb.ID, err)
	}
	return nil
}
