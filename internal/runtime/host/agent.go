package host

// The runtime.Sandbox operations that every backend serves the same way,
// through the guest agent: exec, file reads, writes and listings, the
// transport to the agent's HTTP services, and the explanation of a failed
// agent call (a sandbox that died reports runtime.ErrNotRunning). Backends
// differ only in how they reach the agent and what their sandbox's state
// is.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Sandbox is what the operations need to know of a backend's sandbox.
type Sandbox interface {
	ID() string
	State(ctx context.Context) (runtime.State, error)
}

// Conn is one sandbox's way to its agent.
type Conn struct {
	Sandbox Sandbox
	// Env is the sandbox's environment, put before each exec's own.
	Env []string
	// Agent returns the connected agent client, waiting for it if needed.
	Agent func(ctx context.Context) (*guest.Client, error)
}

// Failure explains an error of operation op from the agent channel: when
// the channel closed because the sandbox is gone, the error wraps
// runtime.ErrNotRunning.
func (c Conn) Failure(ctx context.Context, op string, err error) error {
	if errors.Is(err, guest.ErrClosed) {
		if st, serr := c.Sandbox.State(context.WithoutCancel(ctx)); serr == nil && st != runtime.StateRunning {
			err = fmt.Errorf("%w (%v)", runtime.ErrNotRunning, err)
		}
	}
	return fmt.Errorf("%s in sandbox %s: %w", op, c.Sandbox.ID(), err)
}

// Exec implements runtime.Sandbox.Exec.
func (c Conn) Exec(ctx context.Context, req runtime.ExecRequest) (runtime.ExecResult, error) {
	if len(req.Cmd) == 0 {
		return runtime.ExecResult{}, errors.New("exec: empty command")
	}
	cl, err := c.Agent(ctx)
	if err != nil {
		return runtime.ExecResult{}, c.Failure(ctx, "exec", err)
	}
	spec := guest.ExecSpec{
		Cmd: req.Cmd, Env: append(append([]string(nil), c.Env...), req.Env...), Cwd: req.Cwd,
		User: req.User, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols, Timeout: req.Timeout,
	}
	spec.Tag, spec.Detach = req.Tag, req.Detach
	resize, stop := forwardResize(req.Resize)
	defer stop()
	pio := guest.ExecIO{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr, Resize: resize, Signal: req.Signal}
	if req.Started != nil {
		pio.Started = func(pid int, _ guest.Offsets) { req.Started(pid) }
	}
	start := time.Now()
	e, err := cl.Exec(ctx, spec, pio)
	return c.result(ctx, req.Cmd[0], e, err, start)
}

// result explains how a process followed by Exec or Attach ended.
func (c Conn) result(ctx context.Context, what string, e guest.Exit, err error, start time.Time) (runtime.ExecResult, error) {
	res := runtime.ExecResult{ExitCode: e.Code, Signal: e.Signal, TimedOut: e.TimedOut, OOMKilled: e.OOMKilled, Duration: time.Since(start)}
	switch {
	case err != nil:
		return res, c.Failure(ctx, "exec", err)
	case e.NotFound:
		return res, fmt.Errorf("exec %s in sandbox %s: %w", what, c.Sandbox.ID(), runtime.ErrCommandNotFound)
	case e.Error != "":
		return res, fmt.Errorf("exec %s in sandbox %s: %s", what, c.Sandbox.ID(), e.Error)
	}
	return res, nil
}

// Attach implements runtime.Sandbox.Attach.
func (c Conn) Attach(ctx context.Context, req runtime.AttachRequest) (runtime.ExecResult, error) {
	cl, err := c.Agent(ctx)
	if err != nil {
		return runtime.ExecResult{}, c.Failure(ctx, "attach", err)
	}
	sel := guest.Selector{PID: req.PID, Tag: req.Tag}
	pio := guest.ExecIO{Stdout: req.Stdout, Stderr: req.Stderr}
	if req.Started != nil {
		pio.Started = func(pid int, from guest.Offsets) {
			req.Started(pid, runtime.StreamOffsets{Stdout: from.Stdout, Stderr: from.Stderr})
		}
	}
	start := time.Now()
	e, err := cl.Attach(ctx, sel, guest.Offsets{Stdout: req.From.Stdout, Stderr: req.From.Stderr}, req.Detach, pio)
	return c.result(ctx, sel.String(), e, err, start)
}

// Processes implements runtime.Sandbox.Processes.
func (c Conn) Processes(ctx context.Context) ([]runtime.Process, error) {
	cl, err := c.Agent(ctx)
	if err != nil {
		return nil, c.Failure(ctx, "list processes", err)
	}
	ps, err := cl.Processes(ctx)
	if err != nil {
		return nil, c.Failure(ctx, "list processes", err)
	}
	out := make([]runtime.Process, len(ps))
	for i, p := range ps {
		out[i] = runtime.Process{PID: p.PID, Tag: p.Tag, Cmd: p.Cmd, Cwd: p.Cwd, TTY: p.TTY, Started: p.Started}
	}
	return out, nil
}

// SignalProcess implements runtime.Sandbox.SignalProcess.
func (c Conn) SignalProcess(ctx context.Context, pid int, sig syscall.Signal) error {
	cl, err := c.Agent(ctx)
	if err != nil {
		return c.Failure(ctx, "signal process", err)
	}
	if err := cl.Signal(ctx, guest.Selector{PID: pid}, sig); err != nil {
		return c.Failure(ctx, "signal process", err)
	}
	return nil
}

// forwardResize turns the caller's window sizes into the guest protocol's
// while an exec runs (runtime does not import guest, so the types differ):
// nil for none. stop ends the forwarding; a size sent after it is not
// delivered, and nothing blocks on it.
func forwardResize(in <-chan runtime.WindowSize) (out <-chan guest.Resize, stop func()) {
	if in == nil {
		return nil, func() {}
	}
	ch := make(chan guest.Resize)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case ws, ok := <-in:
				if !ok {
					close(ch) // the client stops reading sizes
					return
				}
				select {
				case ch <- guest.Resize{Rows: ws.Rows, Cols: ws.Cols}:
				case <-done:
					return
				}
			}
		}
	}()
	return ch, func() { close(done) }
}

// ReadFile implements runtime.Sandbox.ReadFile.
func (c Conn) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	cl, err := c.Agent(ctx)
	if err != nil {
		return nil, c.Failure(ctx, "read file", err)
	}
	rc, err := cl.ReadFile(ctx, path)
	if err != nil {
		return nil, c.Failure(ctx, "read file", err)
	}
	return rc, nil
}

// WriteFile implements runtime.Sandbox.WriteFile.
func (c Conn) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	cl, err := c.Agent(ctx)
	if err != nil {
		return c.Failure(ctx, "write file", err)
	}
	if _, err := cl.WriteFile(ctx, path, mode, r); err != nil {
		return c.Failure(ctx, "write file", err)
	}
	return nil
}

// Unpack implements runtime.Unpacker.
func (c Conn) Unpack(ctx context.Context, dir string, r io.Reader) (int, error) {
	cl, err := c.Agent(ctx)
	if err != nil {
		return 0, c.Failure(ctx, "unpack", err)
	}
	out, err := cl.Unpack(ctx, dir, r)
	if err != nil {
		return out.Files, c.Failure(ctx, "unpack", err)
	}
	return out.Files, nil
}

// ListDir implements runtime.Sandbox.ListDir.
func (c Conn) ListDir(ctx context.Context, path string) ([]runtime.DirEntry, error) {
	cl, err := c.Agent(ctx)
	if err != nil {
		return nil, c.Failure(ctx, "list dir", err)
	}
	ents, err := cl.ListDir(ctx, path)
	if err != nil {
		return nil, c.Failure(ctx, "list dir", err)
	}
	out := make([]runtime.DirEntry, len(ents))
	for i, e := range ents {
		out[i] = runtime.DirEntry{Name: e.Name, Size: e.Size, Mode: fs.FileMode(e.Mode), ModTime: e.ModTime, Link: e.Link}
	}
	return out, nil
}

// Ops gives a backend's sandbox Exec, ReadFile, WriteFile, ListDir and
// AgentTransport by embedding: Conn says how to reach the sandbox's agent
// now.
type Ops struct {
	Conn func() Conn
}

// ExecEnv implements runtime.EnvHolder.
func (o Ops) ExecEnv() []string { return o.Conn().Env }

// Exec implements runtime.Sandbox.
func (o Ops) Exec(ctx context.Context, req runtime.ExecRequest) (runtime.ExecResult, error) {
	return o.Conn().Exec(ctx, req)
}

// Attach implements runtime.Sandbox.
func (o Ops) Attach(ctx context.Context, req runtime.AttachRequest) (runtime.ExecResult, error) {
	return o.Conn().Attach(ctx, req)
}

// Processes implements runtime.Sandbox.
func (o Ops) Processes(ctx context.Context) ([]runtime.Process, error) {
	return o.Conn().Processes(ctx)
}

// SignalProcess implements runtime.Sandbox.
func (o Ops) SignalProcess(ctx context.Context, pid int, sig syscall.Signal) error {
	return o.Conn().SignalProcess(ctx, pid, sig)
}

// ReadFile implements runtime.Sandbox.
func (o Ops) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	return o.Conn().ReadFile(ctx, path)
}

// WriteFile implements runtime.Sandbox.
func (o Ops) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	return o.Conn().WriteFile(ctx, path, r, mode)
}

// Unpack implements runtime.Unpacker.
func (o Ops) Unpack(ctx context.Context, dir string, r io.Reader) (int, error) {
	return o.Conn().Unpack(ctx, dir, r)
}

// ListDir implements runtime.Sandbox.
func (o Ops) ListDir(ctx context.Context, path string) ([]runtime.DirEntry, error) {
	return o.Conn().ListDir(ctx, path)
}

// AgentTransport implements runtime.Sandbox: the session's transport to
// the agent's HTTP services, once the agent is connected.
func (o Ops) AgentTransport(ctx context.Context) (http.RoundTripper, error) {
	c, err := o.Conn().Agent(ctx)
	if err != nil {
		return nil, err
	}
	return c.Transport(), nil
}

// Failure explains an error of op from the agent channel (Conn.Failure).
func (o Ops) Failure(ctx context.Context, op string, err error) error {
	return o.Conn().Failure(ctx, op, err)
}

// Call reaches the agent for op and, when f is not nil, runs f on the
// session: it returns the session, or the error explained (Failure).
func (o Ops) Call(ctx context.Context, op string, f func(*guest.Client) error) (*guest.Client, error) {
	c := o.Conn()
	cl, err := c.Agent(ctx)
	if err != nil {
		return nil, c.Failure(ctx, op, err)
	}
	if f != nil {
		if err := f(cl); err != nil {
			return nil, c.Failure(ctx, op, err)
		}
	}
	return cl, nil
}
