package sandbox

import (
	"context"
	"errors"
	"io"
	"io/fs"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/store"
)

// statPath describes path (filecopy.Resolve's rules) in a running sandbox
// this node hosts, without following a final link; it returns the path
// resolved.
func (m *Manager) statPath(ctx context.Context, sb store.Sandbox, path string) (string, filecopy.Entry, error) {
	p, err := filecopy.Resolve(path)
	if err != nil {
		return "", filecopy.Entry{}, err
	}
	fsys, err := m.files(ctx, sb)
	if err != nil {
		return p, filecopy.Entry{}, err
	}
	e, err := fsys.Stat(ctx, p)
	if errors.Is(err, fs.ErrNotExist) {
		return p, e, errdefs.Newf(errdefs.ErrNotFound, "No such file or directory in the sandbox: %s", p)
	}
	return p, e, err
}

// archiveOut measures the archive of path in a running sandbox this node
// hosts (filecopy.Walk), refusing it past lim; its WriteTar sends it.
func (m *Manager) archiveOut(ctx context.Context, sb store.Sandbox, path string, lim filecopy.Limits) (*filecopy.Archive, error) {
	fsys, err := m.files(ctx, sb)
	if err != nil {
		return nil, err
	}
	return filecopy.Walk(ctx, fsys, path, lim)
}

// extractIn writes the tar archive r into the directory dir of a running
// sandbox this node hosts (filecopy.Extract).
func (m *Manager) extractIn(ctx context.Context, sb store.Sandbox, dir string, r io.Reader, lim filecopy.Limits) (filecopy.Extracted, error) {
	fsys, err := m.files(ctx, sb)
	if err != nil {
		return filecopy.Extracted{}, err
	}
	return filecopy.Extract(ctx, fsys, dir, r, lim)
}

// files is the filesystem of a running sandbox this node hosts, as its
// agent serves it (filecopy.AgentFS).
func (m *Manager) files(ctx context.Context, sb store.Sandbox) (filecopy.FS, error) {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return nil, err
	}
	return filecopy.AgentFS(ctx, rsb)
}
