package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	pb "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// agentCallTimeout bounds one call of the agent's filesystem service
// (a stat, a directory made).
const agentCallTimeout = 30 * time.Second

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

// files is the filesystem of a running sandbox as its agent serves it:
// reads, writes and listings through the runtime, stats and new
// directories through the agent's filesystem service.
func (m *Manager) files(ctx context.Context, sb store.Sandbox) (filecopy.FS, error) {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return nil, err
	}
	tr, err := rsb.AgentTransport(ctx)
	if err != nil {
		return nil, fmt.Errorf("reach the agent of %s: %w", sb.ID, err)
	}
	// The transport carries requests to the agent whatever their host.
	agent := filesystemconnect.NewFilesystemClient(&http.Client{Transport: tr}, "http://agent")
	return sandboxFS{rsb: rsb, agent: agent}, nil
}

// sandboxFS is filecopy.FS over a runtime sandbox and its agent.
type sandboxFS struct {
	rsb   runtime.Sandbox
	agent filesystemconnect.FilesystemClient
}

func (s sandboxFS) Stat(ctx context.Context, path string) (filecopy.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	res, err := s.agent.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: path}))
	if err != nil {
		return filecopy.Entry{}, agentError("stat "+path, err)
	}
	e := res.Msg.GetEntry()
	return filecopy.Entry{
		Name: e.GetName(), Size: max(0, e.GetSize()), Mode: fs.FileMode(e.GetMode()),
		ModTime: e.GetModifiedTime().AsTime(), Link: e.GetSymlinkTarget(),
	}, nil
}

func (s sandboxFS) ListDir(ctx context.Context, path string) ([]filecopy.Entry, error) {
	ents, err := s.rsb.ListDir(ctx, path)
	if err != nil {
		return nil, err
	}
	out := make([]filecopy.Entry, len(ents))
	for i, e := range ents {
		out[i] = filecopy.Entry{Name: e.Name, Size: e.Size, Mode: e.Mode, ModTime: e.ModTime, Link: e.Link}
	}
	return out, nil
}

func (s sandboxFS) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	return s.rsb.ReadFile(ctx, path)
}

func (s sandboxFS) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	return s.rsb.WriteFile(ctx, path, r, mode)
}

func (s sandboxFS) MakeDir(ctx context.Context, path string) error {
	e, err := s.Stat(ctx, path)
	switch {
	case err == nil && e.Mode.IsDir():
		return nil
	case err == nil:
		return errdefs.Newf(errdefs.ErrInvalid, "%s exists in the sandbox and is not a directory", path)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	if _, err := s.agent.MakeDir(ctx, connect.NewRequest(&pb.MakeDirRequest{Path: path})); err != nil {
		return agentError("make directory "+path, err)
	}
	return nil
}

// agentError is an error of the agent's filesystem service for op, with
// the classes a caller can act on.
func agentError(op string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return fmt.Errorf("%s: %w", op, fs.ErrNotExist)
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition:
		return errdefs.Wrap(errdefs.ErrInvalid, err, op+": something in the way is not a directory")
	case connect.CodePermissionDenied:
		return errdefs.Wrap(errdefs.ErrForbidden, err, op+": permission denied in the sandbox")
	}
	return fmt.Errorf("%s: %w", op, err)
}
