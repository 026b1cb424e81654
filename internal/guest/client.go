package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// ErrClosed is returned by a Client whose session has ended (the agent died,
// the sandbox stopped, or Close was called).
var ErrClosed = errors.New("guest agent connection closed")

// ClientOptions configure the host side of a connection.
type ClientOptions struct {
	// Home dials the sandboxd API for an OpHome stream the agent opens. Nil
	// refuses such streams.
	Home func(ctx context.Context) (net.Conn, error)
	// HandshakeTimeout bounds the wait for the agent's Hello (default 10s).
	HandshakeTimeout time.Duration
	Logger           *slog.Logger
}

// Client is the host's typed handle on one agent connection. It is safe for
// concurrent use; every method runs on its own yamux stream.
type Client struct {
	hello Hello
	sess  *yamux.Session
	opts  ClientOptions
	log   *slog.Logger
	wg    sync.WaitGroup
}

// Accept performs the host side of the handshake on conn (a connection the
// agent made) and starts the session. It owns conn from then on.
func Accept(conn net.Conn, opts ClientOptions) (*Client, error) {
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_ = conn.SetDeadline(time.Now().Add(opts.HandshakeTimeout))
	var h Hello
	if err := ReadJSON(conn, FrameHello, &h); err != nil {
		conn.Close()
		return nil, fmt.Errorf("read agent hello: %w", err)
	}
	w := Welcome{Protocol: Protocol}
	if h.Protocol != Protocol {
		w.Error = fmt.Sprintf("host speaks protocol %d, agent %d", Protocol, h.Protocol)
	}
	if err := WriteJSON(conn, FrameWelcome, w); err != nil {
		conn.Close()
		return nil, fmt.Errorf("write welcome: %w", err)
	}
	if w.Error != "" {
		conn.Close()
		return nil, fmt.Errorf("%w: %s", ErrProtocol, w.Error)
	}
	_ = conn.SetDeadline(time.Time{})
	sess, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start session: %w", err)
	}
	c := &Client{hello: h, sess: sess, opts: opts, log: log}
	c.wg.Add(1)
	go c.acceptLoop()
	return c, nil
}

// Hello returns what the agent said about itself.
func (c *Client) Hello() Hello { return c.hello }

// Done is closed when the session ends.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Close ends the session; running operations fail with ErrClosed.
func (c *Client) Close() error {
	err := c.sess.Close()
	c.wg.Wait()
	return err
}

// acceptLoop serves the streams the agent opens: connections home.
func (c *Client) acceptLoop() {
	defer c.wg.Done()
	for {
		st, err := c.sess.AcceptStream()
		if err != nil {
			return
		}
		go c.serveAgentStream(st)
	}
}

func (c *Client) serveAgentStream(st *yamux.Stream) {
	defer st.Close()
	var req Request
	_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := ReadJSON(st, FrameRequest, &req); err != nil {
		c.log.Debug("agent stream: bad request", "err", err)
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	if req.Op != OpHome || c.opts.Home == nil {
		c.log.Debug("agent stream refused", "op", req.Op)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	home, err := c.opts.Home(ctx)
	cancel()
	if err != nil {
		c.log.Warn("dial sandboxd api for sandbox", "err", err)
		return
	}
	Splice(st, home)
}

// Splice copies between a and b in both directions until both directions
// end, propagating half-closes, then closes both.
func Splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		closeWrite(dst)
	}
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

func closeWrite(c net.Conn) {
	type closeWriter interface{ CloseWrite() error }
	if cw, ok := c.(closeWriter); ok {
		_ = cw.CloseWrite()
		return
	}
	// A yamux stream's Close is a half-close (FIN): the peer may still send.
	if st, ok := c.(*yamux.Stream); ok {
		_ = st.Close()
	}
}

// open starts an operation stream and sends its request.
func (c *Client) open(ctx context.Context, req Request) (*yamux.Stream, func(), error) {
	st, err := c.sess.OpenStream()
	if err != nil {
		if c.sess.IsClosed() {
			return nil, nil, fmt.Errorf("%s: %w", req.Op, ErrClosed)
		}
		return nil, nil, fmt.Errorf("open %s stream: %w", req.Op, err)
	}
	// Cancelling ctx unblocks reads and writes; the agent sees the stream
	// close and abandons the operation.
	stop := context.AfterFunc(ctx, func() {
		_ = st.SetDeadline(time.Now())
		_ = st.Close()
	})
	if err := WriteJSON(st, FrameRequest, req); err != nil {
		stop()
		st.Close()
		return nil, nil, c.streamErr(ctx, req.Op, err)
	}
	return st, func() { stop(); st.Close() }, nil
}

// streamErr explains a stream failure: cancellation, a dead session, or the
// error itself.
func (c *Client) streamErr(ctx context.Context, op Op, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	if c.sess.IsClosed() || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// resultErr turns a failed Result into an error; not-found errors wrap
// fs.ErrNotExist so callers can test with errors.Is.
func resultErr(op Op, path string, r Result) error {
	if r.Error == "" {
		return nil
	}
	switch r.ErrorKind {
	case KindNotFound:
		return fmt.Errorf("%s %s: %w", op, path, fs.ErrNotExist)
	case KindIsDir:
		return fmt.Errorf("%s %s: %w", op, path, syscall.EISDIR)
	}
	return fmt.Errorf("%s %s: %s", op, path, r.Error)
}

// call runs a request/response operation with no data phase.
func (c *Client) call(ctx context.Context, req Request) (Result, error) {
	st, done, err := c.open(ctx, req)
	if err != nil {
		return Result{}, err
	}
	defer done()
	var r Result
	if err := ReadJSON(st, FrameResult, &r); err != nil {
		return Result{}, c.streamErr(ctx, req.Op, err)
	}
	return r, resultErr(req.Op, req.Path, r)
}

// Ping asks the agent how it is.
func (c *Client) Ping(ctx context.Context) (Health, error) {
	r, err := c.call(ctx, Request{Op: OpPing})
	if err != nil {
		return Health{}, err
	}
	if r.Health == nil {
		return Health{}, fmt.Errorf("%w: ping without health", ErrProtocol)
	}
	return *r.Health, nil
}

// Sync flushes the sandbox's filesystems to the host.
func (c *Client) Sync(ctx context.Context) error {
	_, err := c.call(ctx, Request{Op: OpSync})
	return err
}

// OOMKill kills the process using the most memory inside the sandbox.
func (c *Client) OOMKill(ctx context.Context) (Killed, error) {
	r, err := c.call(ctx, Request{Op: OpOOMKill})
	if err != nil {
		return Killed{}, err
	}
	if r.Killed == nil {
		return Killed{}, nil
	}
	return *r.Killed, nil
}

// ListDir lists a directory.
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	r, err := c.call(ctx, Request{Op: OpListDir, Path: path})
	if err != nil {
		return nil, err
	}
	return r.Entries, nil
}

// WriteFile replaces path with the content of r (atomically: the agent
// writes a temporary file and renames it), creating parent directories.
func (c *Client) WriteFile(ctx context.Context, path string, mode fs.FileMode, r io.Reader) (int64, error) {
	st, done, err := c.open(ctx, Request{Op: OpWriteFile, Path: path, Mode: uint32(mode)})
	if err != nil {
		return 0, err
	}
	defer done()
	// The agent may refuse early (for instance a read-only path); read its
	// answer concurrently so a refusal does not wait for the whole upload.
	res := make(chan error, 1)
	var result Result
	go func() { res <- ReadJSON(st, FrameResult, &result) }()
	buf := make([]byte, chunkSize)
	var sent int64
	var upErr error
	for upErr == nil {
		n, rerr := r.Read(buf)
		if n > 0 {
			if err := WriteFrame(st, FrameData, buf[:n]); err != nil {
				upErr = err
				break
			}
			sent += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// Tell the agent to discard the partial file.
			_ = WriteJSON(st, FrameEnd, End{Error: rerr.Error()})
			<-res
			return sent, fmt.Errorf("write %s: read source: %w", path, rerr)
		}
	}
	if upErr == nil {
		upErr = WriteJSON(st, FrameEnd, End{})
	}
	if err := <-res; err != nil {
		return sent, c.streamErr(ctx, OpWriteFile, err)
	}
	if err := resultErr(OpWriteFile, path, result); err != nil {
		return sent, err
	}
	if upErr != nil {
		return sent, c.streamErr(ctx, OpWriteFile, upErr)
	}
	return result.Size, nil
}

// ReadFile opens path for reading. The returned reader streams the content;
// it fails with an error if the transfer breaks. Close it when done.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, FileInfo, error) {
	st, done, err := c.open(ctx, Request{Op: OpReadFile, Path: path})
	if err != nil {
		return nil, FileInfo{}, err
	}
	t, payload, err := ReadFrame(st)
	if err != nil {
		done()
		return nil, FileInfo{}, c.streamErr(ctx, OpReadFile, err)
	}
	switch t {
	case FrameResult:
		done()
		var r Result
		if err := json.Unmarshal(payload, &r); err != nil {
			return nil, FileInfo{}, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		if err := resultErr(OpReadFile, path, r); err != nil {
			return nil, FileInfo{}, err
		}
		return nil, FileInfo{}, fmt.Errorf("%w: read answered without a file", ErrProtocol)
	case FrameHeader:
		var fi FileInfo
		if err := json.Unmarshal(payload, &fi); err != nil {
			done()
			return nil, FileInfo{}, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		return &fileReader{ctx: ctx, c: c, st: st, done: done, path: path}, fi, nil
	}
	done()
	return nil, FileInfo{}, fmt.Errorf("%w: unexpected frame %d", ErrProtocol, t)
}

type fileReader struct {
	ctx  context.Context
	c    *Client
	st   *yamux.Stream
	done func()
	path string
	buf  []byte
	err  error
}

func (f *fileReader) Read(p []byte) (int, error) {
	for len(f.buf) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		t, payload, err := ReadFrame(f.st)
		if err != nil {
			f.err = f.c.streamErr(f.ctx, OpReadFile, err)
			continue
		}
		switch t {
		case FrameData:
			f.buf = payload
		case FrameEnd:
			var e End
			if err := json.Unmarshal(payload, &e); err != nil {
				f.err = fmt.Errorf("%w: %v", ErrProtocol, err)
			} else if e.Error != "" {
				f.err = fmt.Errorf("read %s: %s", f.path, e.Error)
			} else {
				f.err = io.EOF
			}
		default:
			f.err = fmt.Errorf("%w: unexpected frame %d", ErrProtocol, t)
		}
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	return n, nil
}

func (f *fileReader) Close() error {
	f.done()
	return nil
}

// killGrace is how long Exec waits for the agent to report a killed process
// after its context ended.
const killGrace = 5 * time.Second

// ExecIO connects a process's standard streams. Nil Stdin means /dev/null;
// nil Stdout or Stderr discard. Resize, when not nil, delivers TTY window
// sizes; Signal delivers signals for the process's session.
type ExecIO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Resize <-chan Resize
	Signal <-chan syscall.Signal
}

// Exec runs a process and streams its output into io as it arrives. It
// returns when the process has exited and its output is delivered. If ctx
// ends first, the agent kills the process's session and Exec returns the
// context's error.
func (c *Client) Exec(ctx context.Context, spec ExecSpec, pio ExecIO) (Exit, error) {
	spec.Stdin = pio.Stdin != nil
	// The stream is not tied to ctx directly: on cancellation we first ask
	// the agent to kill the process, so it never outlives the request.
	st, done, err := c.open(context.WithoutCancel(ctx), Request{Op: OpExec, Exec: &spec})
	if err != nil {
		return Exit{}, err
	}
	defer done()
	var wmu sync.Mutex
	send := func(t FrameType, v any) error {
		wmu.Lock()
		defer wmu.Unlock()
		if b, ok := v.([]byte); ok {
			return WriteFrame(st, t, b)
		}
		return WriteJSON(st, t, v)
	}
	finished := make(chan struct{})
	defer close(finished)
	if pio.Stdin != nil {
		go func() {
			buf := make([]byte, chunkSize)
			for {
				n, err := pio.Stdin.Read(buf)
				if n > 0 {
					if send(FrameStdin, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					_ = send(FrameStdinClose, []byte{})
					return
				}
			}
		}()
	}
	go func() {
		for {
			select {
			case <-finished:
				return
			case <-ctx.Done():
				_ = send(FrameSignal, Signal{Signal: int(syscall.SIGKILL)})
				// An agent that cannot answer (a frozen sandbox) must not
				// hold the caller: give up on the stream after a grace.
				select {
				case <-finished:
				case <-time.After(killGrace):
					_ = st.SetDeadline(time.Now())
				}
				return
			case r, ok := <-pio.Resize:
				if !ok {
					pio.Resize = nil
					continue
				}
				_ = send(FrameResize, r)
			case s, ok := <-pio.Signal:
				if !ok {
					pio.Signal = nil
					continue
				}
				_ = send(FrameSignal, Signal{Signal: int(s)})
			}
		}
	}()
	stdout, stderr := pio.Stdout, pio.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for {
		t, payload, err := ReadFrame(st)
		if err != nil {
			if ctx.Err() != nil {
				return Exit{}, fmt.Errorf("exec: %w", ctx.Err())
			}
			return Exit{}, c.streamErr(ctx, OpExec, err)
		}
		switch t {
		case FrameStarted:
		case FrameStdout:
			if _, err := stdout.Write(payload); err != nil {
				// The consumer is gone; stop the process rather than block it.
				_ = send(FrameSignal, Signal{Signal: int(syscall.SIGKILL)})
				stdout = io.Discard
			}
		case FrameStderr:
			if _, err := stderr.Write(payload); err != nil {
				_ = send(FrameSignal, Signal{Signal: int(syscall.SIGKILL)})
				stderr = io.Discard
			}
		case FrameExit:
			var e Exit
			if err := json.Unmarshal(payload, &e); err != nil {
				return Exit{}, fmt.Errorf("%w: %v", ErrProtocol, err)
			}
			if ctx.Err() != nil {
				return e, fmt.Errorf("exec: %w", ctx.Err())
			}
			return e, nil
		default:
			return Exit{}, fmt.Errorf("%w: unexpected frame %d in exec", ErrProtocol, t)
		}
	}
}
