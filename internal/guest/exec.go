package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/sandboxd/sandboxd/internal/guest/pb/process"
)

// killGrace is how long Exec waits for the agent to report a killed process
// after its context ended.
const killGrace = 5 * time.Second

// Bounds on a process listing from the agent.
const (
	maxProcesses  = 4096
	maxListedArgs = 64
)

// ExecIO connects a process's standard streams. Nil Stdin means /dev/null;
// nil Stdout or Stderr discard (a terminal's output goes to Stdout).
// Resize, when not nil, delivers TTY window sizes; Signal delivers signals
// for the process's session. Started, when not nil, is told the process's
// pid and, on Attach, where the replayed output begins.
type ExecIO struct {
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	Resize  <-chan Resize
	Signal  <-chan syscall.Signal
	Started func(pid int, from Offsets)
}

// Offsets count the bytes of a process's output streams since it started
// (a terminal's output counts as Stdout).
type Offsets struct {
	Stdout, Stderr uint64
}

// Selector names a process of the agent: by pid, or by the tag it was
// started with.
type Selector struct {
	PID int
	Tag string
}

func (s Selector) message() *process.ProcessSelector {
	if s.Tag != "" {
		return &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: s.Tag}}
	}
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: uint32(s.PID)}}
}

func (s Selector) String() string {
	if s.Tag != "" {
		return "process " + strconv.Quote(s.Tag)
	}
	return fmt.Sprintf("process %d", s.PID)
}

// Exec runs a process and streams its output into pio as it arrives. It
// returns when the process has exited and its output is delivered. If ctx
// ends first, the agent kills the process's session and Exec returns the
// context's error. If only the connection ends (the host goes away), the
// process keeps running in the sandbox and Attach finds it again.
func (c *Client) Exec(ctx context.Context, spec ExecSpec, pio ExecIO) (Exit, error) {
	if len(spec.Cmd) == 0 {
		return Exit{}, errors.New("exec: empty command")
	}
	req := &process.StartRequest{
		Process: &process.ProcessConfig{Cmd: spec.Cmd[0], Args: spec.Cmd[1:], Envs: envMap(spec.Env)},
		Stdin:   proto.Bool(pio.Stdin != nil),
	}
	if spec.Cwd != "" {
		req.Process.Cwd = &spec.Cwd
	}
	if spec.Tag != "" {
		req.Tag = &spec.Tag
	}
	if spec.Timeout > 0 {
		req.TimeoutMs = uint64(max(spec.Timeout.Milliseconds(), 1))
	}
	if spec.TTY {
		req.Pty = &process.PTY{Size: &process.PTY_Size{Rows: uint32(spec.Rows), Cols: uint32(spec.Cols)}}
	}
	// The stream is not tied to ctx directly: on cancellation we first ask
	// the agent to kill the process, so it never outlives the request.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	f := c.newFollower(ctx, cancel, "exec", pio, spec.TTY, spec.Detach)
	creq := connect.NewRequest(req)
	if spec.User != "" {
		creq.Header().Set(UserHeader, spec.User)
	}
	stream, err := c.proc.Start(sctx, creq)
	return followStream(f, stream, err, (*process.StartResponse).GetEvent)
}

// Attach follows a process the agent started earlier (by this host before
// it restarted, or by another connection): what the agent kept of its
// output from the offsets in from on, then live output and its end. The
// replayed output begins where Started's offsets say; output before that
// no longer fitted the agent's tail. Cancelling ctx kills the process,
// like Exec, unless detach says to leave it running.
func (c *Client) Attach(ctx context.Context, sel Selector, from Offsets, detach bool, pio ExecIO) (Exit, error) {
	if pio.Stdin != nil {
		return Exit{}, errors.New("attach: input goes through SendInput, not a reader")
	}
	req := &process.ConnectRequest{Process: sel.message(), StdoutFrom: from.Stdout, StderrFrom: from.Stderr, PtyFrom: from.Stdout}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	f := c.newFollower(ctx, cancel, "attach to "+sel.String(), pio, false, detach)
	stream, err := c.proc.Connect(sctx, connect.NewRequest(req))
	return followStream(f, stream, err, (*process.ConnectResponse).GetEvent)
}

// followStream runs f on a stream of process events (Start's or
// Connect's answer, opened with err).
func followStream[Res any](f *follower, stream *connect.ServerStreamForClient[Res], err error, event func(*Res) *process.ProcessEvent) (Exit, error) {
	if err != nil {
		return Exit{}, f.failure(err)
	}
	defer stream.Close()
	return f.run(func() (*process.ProcessEvent, error) {
		if !stream.Receive() {
			return nil, streamEnd(stream.Err())
		}
		return event(stream.Msg()), nil
	})
}

// streamEnd is the error of a stream that ended: its own, or EOF for one
// that ended cleanly before the process's end event.
func streamEnd(err error) error {
	if err == nil {
		return io.ErrUnexpectedEOF
	}
	return err
}

// follower turns a process's events into writes and an Exit, and while it
// runs forwards input, window sizes, signals and cancellation to the agent.
type follower struct {
	c        *Client
	ctx      context.Context
	cancel   context.CancelFunc
	op       string
	pio      ExecIO
	tty      bool
	detach   bool
	noAnswer atomic.Bool
	first    *time.Timer
	finished chan struct{}
}

func (c *Client) newFollower(ctx context.Context, cancel context.CancelFunc, op string, pio ExecIO, tty, detach bool) *follower {
	f := &follower{c: c, ctx: ctx, cancel: cancel, op: op, pio: pio, tty: tty, detach: detach, finished: make(chan struct{})}
	// The first event is due within CallTimeout; from then on the stream
	// lives as long as the process.
	f.first = time.AfterFunc(c.opts.CallTimeout, func() { f.noAnswer.Store(true); cancel() })
	return f
}

func (f *follower) failure(err error) error {
	f.first.Stop()
	if f.noAnswer.Load() {
		err = ErrNoAnswer
	}
	return f.c.fail(f.ctx, f.op, err)
}

func (f *follower) run(next func() (*process.ProcessEvent, error)) (Exit, error) {
	defer close(f.finished)
	defer f.first.Stop()
	stdout, stderr := f.pio.Stdout, f.pio.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	var sel *Selector
	write := func(w *io.Writer, b []byte) {
		if _, err := (*w).Write(b); err != nil {
			// The consumer is gone; stop the process rather than block it.
			*w = io.Discard
			if sel != nil {
				go f.c.signal(context.WithoutCancel(f.ctx), *sel, syscall.SIGKILL)
			}
		}
	}
	for {
		ev, err := next()
		if err != nil {
			if f.ctx.Err() != nil {
				return Exit{}, fmt.Errorf("%s: %w", f.op, f.ctx.Err())
			}
			return Exit{}, f.failure(err)
		}
		f.first.Stop()
		switch e := ev.GetEvent().(type) {
		case *process.ProcessEvent_Start:
			pid := e.Start.GetPid()
			if sel != nil || pid == 0 || pid > MaxPID {
				return Exit{}, protoErr("%s: start event for pid %d", f.op, pid)
			}
			sel = &Selector{PID: int(pid)}
			from := Offsets{Stdout: e.Start.GetStdoutOffset() + e.Start.GetPtyOffset(), Stderr: e.Start.GetStderrOffset()}
			if f.pio.Started != nil {
				f.pio.Started(int(pid), from)
			}
			go f.control(*sel)
		case *process.ProcessEvent_Data:
			switch o := e.Data.GetOutput().(type) {
			case *process.ProcessEvent_DataEvent_Stdout:
				write(&stdout, o.Stdout)
			case *process.ProcessEvent_DataEvent_Pty:
				write(&stdout, o.Pty)
			case *process.ProcessEvent_DataEvent_Stderr:
				write(&stderr, o.Stderr)
			}
		case *process.ProcessEvent_End:
			exit, err := exitFrom(e.End)
			if err != nil {
				return Exit{}, err
			}
			if f.ctx.Err() != nil {
				return exit, fmt.Errorf("%s: %w", f.op, f.ctx.Err())
			}
			return exit, nil
		case *process.ProcessEvent_Keepalive:
		default:
			return Exit{}, protoErr("%s: unknown event", f.op)
		}
	}
}

// control forwards input, window sizes and signals to process sel until
// it ends, and kills it when the caller's context ends.
func (f *follower) control(sel Selector) {
	bg := context.WithoutCancel(f.ctx)
	if f.pio.Stdin != nil {
		go f.c.pumpInput(bg, sel, f.pio.Stdin, f.tty, f.finished)
	}
	resize, signals := f.pio.Resize, f.pio.Signal
	for {
		select {
		case <-f.finished:
			return
		case <-f.ctx.Done():
			if f.detach {
				f.cancel() // stop following; the process runs on
				return
			}
			_ = f.c.signal(bg, sel, syscall.SIGKILL)
			// An agent that cannot answer (a frozen sandbox) must not hold
			// the caller: give up on the stream after a grace.
			select {
			case <-f.finished:
			case <-time.After(killGrace):
				f.cancel()
			}
			return
		case r, ok := <-resize:
			if !ok {
				resize = nil
				continue
			}
			_ = f.c.Resize(bg, sel, r)
		case s, ok := <-signals:
			if !ok {
				signals = nil
				continue
			}
			_ = f.c.signal(bg, sel, s)
		}
	}
}

// pumpInput streams r to the process's input in order (one StreamInput
// call), then closes its input.
func (c *Client) pumpInput(ctx context.Context, sel Selector, r io.Reader, tty bool, finished <-chan struct{}) {
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-finished:
			cancel()
		case <-ictx.Done():
		}
	}()
	st := c.proc.StreamInput(ictx)
	if err := st.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel.message()}}}); err != nil {
		_, _ = st.CloseAndReceive()
		return
	}
	buf := make([]byte, chunkSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			in := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}
			if tty {
				in.Input = &process.ProcessInput_Pty{Pty: append([]byte(nil), buf[:n]...)}
			}
			if st.Send(&process.StreamInputRequest{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: in}}}) != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	if _, err := st.CloseAndReceive(); err != nil || ictx.Err() != nil {
		return
	}
	_, _ = unary(ictx, c, "close stdin", c.proc.CloseStdin, &process.CloseStdinRequest{Process: sel.message()})
}

// Resize changes the terminal size of process sel.
func (c *Client) Resize(ctx context.Context, sel Selector, r Resize) error {
	_, err := unary(ctx, c, "resize "+sel.String(), c.proc.Update, &process.UpdateRequest{
		Process: sel.message(), Pty: &process.PTY{Size: &process.PTY_Size{Rows: uint32(r.Rows), Cols: uint32(r.Cols)}},
	})
	return err
}

// Signal sends sig to the session of process sel: the process and every
// process it started.
func (c *Client) Signal(ctx context.Context, sel Selector, sig syscall.Signal) error {
	return c.signal(ctx, sel, sig)
}

func (c *Client) signal(ctx context.Context, sel Selector, sig syscall.Signal) error {
	_, err := unary(ctx, c, "signal "+sel.String(), c.proc.SendSignal, &process.SendSignalRequest{Process: sel.message(), Signal: process.Signal(sig)})
	return err
}

// Processes lists the processes the agent started that still run.
func (c *Client) Processes(ctx context.Context) ([]Process, error) {
	r, err := unary(ctx, c, "list processes", c.proc.List, &process.ListRequest{})
	if err != nil {
		return nil, err
	}
	if len(r.GetProcesses()) > maxProcesses {
		return nil, protoErr("listing of %d processes", len(r.GetProcesses()))
	}
	out := make([]Process, 0, len(r.GetProcesses()))
	for _, p := range r.GetProcesses() {
		if p.GetPid() == 0 || p.GetPid() > MaxPID {
			return nil, protoErr("process with pid %d", p.GetPid())
		}
		args := p.GetConfig().GetArgs()
		if len(args) > maxListedArgs {
			args = args[:maxListedArgs]
		}
		cmd := []string{CleanText(p.GetConfig().GetCmd())}
		for _, a := range args {
			cmd = append(cmd, CleanText(a))
		}
		out = append(out, Process{
			PID: int(p.GetPid()), Tag: CleanText(p.GetTag()), Cmd: cmd, Cwd: CleanText(p.GetConfig().GetCwd()),
			TTY: p.GetPty(), Started: p.GetStarted().AsTime(),
		})
	}
	return out, nil
}

// exitFrom checks and converts a process's end event.
func exitFrom(e *process.ProcessEvent_EndEvent) (Exit, error) {
	x := Exit{
		Code: int(e.GetExitCode()), Signal: int(e.GetSignal()), TimedOut: e.GetTimedOut(),
		OOMKilled: e.GetOomKilled(), NotFound: e.GetNotFound(), Error: CleanText(e.GetError()),
	}
	if err := checkExit(x); err != nil {
		return Exit{}, err
	}
	return x, nil
}

// envMap turns NAME=value pairs into the message's map; a later pair
// replaces an earlier one of the same name.
func envMap(env []string) map[string]string {
	if len(env) == 0 {
		return nil
	}
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}
