package filecopy

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
	pb "github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// agentCallTimeout bounds one call of the agent's filesystem service
// (a stat, a directory made).
const agentCallTimeout = 30 * time.Second

// AgentFS is the filesystem of running sandbox rsb as its agent serves
// it: reads, writes and listings through the runtime, stats and new
// directories through the agent's filesystem service. Every path is
// resolved by the agent inside the sandbox, never on the host.
func AgentFS(ctx context.Context, rsb runtime.Sandbox) (FS, error) {
	tr, err := rsb.AgentTransport(ctx)
	if err != nil {
		return nil, fmt.Errorf("reach the agent of %s: %w", rsb.ID(), err)
	}
	// The transport carries requests to the agent whatever their host.
	agent := filesystemconnect.NewFilesystemClient(&http.Client{Transport: tr}, "http://agent")
	return agentFS{rsb: rsb, agent: agent}, nil
}

// agentFS is FS over a runtime sandbox and its agent.
type agentFS struct {
	rsb   runtime.Sandbox
	agent filesystemconnect.FilesystemClient
}

func (s agentFS) Stat(ctx context.Context, path string) (Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, agentCallTimeout)
	defer cancel()
	res, err := s.agent.Stat(ctx, connect.NewRequest(&pb.StatRequest{Path: path}))
	if err != nil {
		return Entry{}, agentError("stat "+path, err)
	}
	e := res.Msg.GetEntry()
	return Entry{
		Name: e.GetName(), Size: max(0, e.GetSize()), Mode: fs.FileMode(e.GetMode()),
		ModTime: e.GetModifiedTime().AsTime(), Link: e.GetSymlinkTarget(),
	}, nil
}

func (s agentFS) ListDir(ctx context.Context, path string) ([]Entry, error) {
	ents, err := s.rsb.ListDir(ctx, path)
	if err != nil {
		return nil, err
	}
	out := make([]Entry, len(ents))
	for i, e := range ents {
		out[i] = Entry{Name: e.Name, Size: e.Size, Mode: e.Mode, ModTime: e.ModTime, Link: e.Link}
	}
	return out, nil
}

func (s agentFS) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	return s.rsb.ReadFile(ctx, path)
}

func (s agentFS) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	return s.rsb.WriteFile(ctx, path, r, mode)
}

func (s agentFS) MakeDir(ctx context.Context, path string) error {
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
