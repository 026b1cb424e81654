package guest

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/time/rate"
)

// ErrClosed is returned by a Client whose session has ended (the agent died,
// the sandbox stopped, or Close was called).
var ErrClosed = errors.New("guest agent connection closed")

// ErrNoAnswer is returned when the agent does not answer a call, or does
// not move a transfer on, within ClientOptions.CallTimeout.
var ErrNoAnswer = errors.New("guest agent did not answer in time")

// ErrUnauthenticated is returned by Accept when the peer could not prove
// it holds the sandbox's secret: another process than the real agent.
var ErrUnauthenticated = errors.New("guest agent failed authentication")

// DefaultCallTimeout is ClientOptions.CallTimeout's default.
const DefaultCallTimeout = 2 * time.Minute

// maxPendingAgentStreams bounds the streams the agent opened that have not
// yet sent their request: each holds a goroutine for up to homeRequestWait.
// The host takes at most agentStreamRate new streams a second (bursts of
// agentStreamBurst); beyond that yamux resets them unseen once its accept
// backlog is full, so an agent that opens streams without end and never
// closes them holds at most rate × StreamCloseTimeout of them.
const (
	maxPendingAgentStreams = 64
	homeRequestWait        = 10 * time.Second
	agentStreamRate        = 200
	agentStreamBurst       = 400
)

// ClientOptions configure the host side of a connection.
type ClientOptions struct {
	// Home serves one connection a process in the sandbox opened to
	// sandboxd.internal (an OpHome stream); it owns conn and applies the
	// sandbox's limits. Nil refuses such streams.
	Home func(conn net.Conn)
	// HandshakeTimeout bounds the handshake (default 10s).
	HandshakeTimeout time.Duration
	// Secret, when set, must be proved by the agent in the handshake
	// (Welcome.Challenge); a peer that cannot is refused with
	// ErrUnauthenticated.
	Secret []byte
	// CallTimeout bounds every request/response call and, in streamed
	// transfers (file reads and writes, layer exports), the wait for each
	// frame, so an agent that stops answering cannot hold a host goroutine
	// (default DefaultCallTimeout). Exec streams live as long as their
	// process; only their start is bounded.
	CallTimeout time.Duration
	Logger      *slog.Logger
}

// Client is the host's typed handle on one agent connection. It is safe for
// concurrent use; every method runs on its own yamux stream.
type Client struct {
	hello   Hello
	sess    *yamux.Session
	opts    ClientOptions
	log     *slog.Logger
	wg      sync.WaitGroup
	pending chan struct{} // agent streams that have not sent their request
}

func newClient(h Hello, sess *yamux.Session, opts ClientOptions, log *slog.Logger) *Client {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	c := &Client{hello: h, sess: sess, opts: opts, log: log, pending: make(chan struct{}, maxPendingAgentStreams)}
	c.wg.Add(1)
	go c.acceptLoop()
	return c
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
	} else if err := CheckHello(h); err != nil {
		w.Error = err.Error()
	}
	if w.Error == "" && len(opts.Secret) > 0 {
		w.Challenge = make([]byte, ChallengeSize)
		_, _ = rand.Read(w.Challenge)
	}
	if err := WriteJSON(conn, FrameWelcome, w); err != nil {
		conn.Close()
		return nil, fmt.Errorf("write welcome: %w", err)
	}
	if w.Error != "" {
		conn.Close()
		return nil, fmt.Errorf("%w: %s", ErrProtocol, w.Error)
	}
	if w.Challenge != nil {
		var p Proof
		if err := ReadJSON(conn, FrameProof, &p); err != nil {
			conn.Close()
			return nil, fmt.Errorf("%w: read proof: %v", ErrUnauthenticated, err)
		}
		if !hmac.Equal(p.MAC, ProofMAC(opts.Secret, w.Challenge)) {
			conn.Close()
			return nil, fmt.Errorf("%w: wrong proof from pid %d", ErrUnauthenticated, h.PID)
		}
	}
	_ = conn.SetDeadline(time.Time{})
	sess, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start session: %w", err)
	}
	return newClient(h, sess, opts, log), nil
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

// acceptLoop serves the streams the agent opens: connections home. The
// agent may open streams without bound; those that have not said what they
// are yet are capped (maxPendingAgentStreams), and Home caps the rest.
func (c *Client) acceptLoop() {
	defer c.wg.Done()
	lim := rate.NewLimiter(agentStreamRate, agentStreamBurst)
	for {
		if d := lim.Reserve().Delay(); d > 0 {
			select {
			case <-time.After(d):
			case <-c.sess.CloseChan():
				return
			}
		}
		st, err := c.sess.AcceptStream()
		if err != nil {
			return
		}
		select {
		case c.pending <- struct{}{}:
			go c.serveAgentStream(st)
		default:
			c.log.Debug("agent stream refused: too many pending")
			st.Close()
		}
	}
}

func (c *Client) serveAgentStream(st *yamux.Stream) {
	var req Request
	_ = st.SetReadDeadline(time.Now().Add(homeRequestWait))
	err := ReadJSON(st, FrameRequest, &req)
	<-c.pending
	if err != nil {
		c.log.Debug("agent stream: bad request", "err", err)
		st.Close()
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	if req.Op != OpHome || c.opts.Home == nil {
		c.log.Debug("agent stream refused", "op", CleanText(string(req.Op)))
		st.Close()
		return
	}
	c.opts.Home(st)
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

// opStream is an operation's stream with deadlines that cancellation wins
// over: once the operation's context ended, no idle deadline re-arms it.
type opStream struct {
	*yamux.Stream
	mu       sync.Mutex
	canceled bool
}

func (s *opStream) cancel() {
	s.mu.Lock()
	s.canceled = true
	_ = s.Stream.SetDeadline(time.Now())
	s.mu.Unlock()
	_ = s.Stream.Close()
}

// readWithin makes the next reads fail unless data arrives within d (0:
// no deadline).
func (s *opStream) readWithin(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.canceled {
		_ = s.Stream.SetReadDeadline(deadline(d))
	}
}

// writeWithin makes the next writes fail unless the agent takes them
// within d.
func (s *opStream) writeWithin(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.canceled {
		_ = s.Stream.SetWriteDeadline(deadline(d))
	}
}

func deadline(d time.Duration) time.Time {
	if d <= 0 {
		return time.Time{}
	}
	return time.Now().Add(d)
}

// open starts an operation stream and sends its request.
func (c *Client) open(ctx context.Context, req Request) (*opStream, func(), error) {
	ys, err := c.sess.OpenStream()
	if err != nil {
		if c.sess.IsClosed() {
			return nil, nil, fmt.Errorf("%s: %w", req.Op, ErrClosed)
		}
		return nil, nil, fmt.Errorf("open %s stream: %w", req.Op, err)
	}
	st := &opStream{Stream: ys}
	// Cancelling ctx unblocks reads and writes; the agent sees the stream
	// close and abandons the operation.
	stop := context.AfterFunc(ctx, st.cancel)
	st.writeWithin(c.opts.CallTimeout)
	if err := WriteJSON(st, FrameRequest, req); err != nil {
		stop()
		st.Close()
		return nil, nil, c.streamErr(ctx, req.Op, err)
	}
	return st, func() { stop(); st.Close() }, nil
}

// streamErr explains a stream failure: cancellation, a dead session, an
// agent that stopped answering, or the error itself.
func (c *Client) streamErr(ctx context.Context, op Op, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, yamux.ErrTimeout) {
		return fmt.Errorf("%s: %w (%s)", op, ErrNoAnswer, c.opts.CallTimeout)
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
	return fmt.Errorf("%s %s: %s", op, path, CleanText(r.Error))
}

// call runs a request/response operation with no data phase; the agent
// must answer within CallTimeout.
func (c *Client) call(ctx context.Context, req Request) (Result, error) {
	st, done, err := c.open(ctx, req)
	if err != nil {
		return Result{}, err
	}
	defer done()
	st.readWithin(c.opts.CallTimeout)
	var r Result
	if err := ReadJSON(st, FrameResult, &r); err != nil {
		return Result{}, c.streamErr(ctx, req.Op, err)
	}
	if r.Size < 0 {
		return Result{}, protoErr("%s answered size %d", req.Op, r.Size)
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
	if err := checkHealth(*r.Health); err != nil {
		return Health{}, err
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
	if err := checkKilled(*r.Killed); err != nil {
		return Killed{}, err
	}
	r.Killed.Name = CleanText(r.Killed.Name)
	return *r.Killed, nil
}

// ListDir lists a directory: at most MaxListEntries entries, each a plain
// name (no "/", not "." or "..").
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	r, err := c.call(ctx, Request{Op: OpListDir, Path: path})
	if err != nil {
		return nil, err
	}
	if len(r.Entries) > MaxListEntries {
		return nil, protoErr("listing of %d entries (at most %d)", len(r.Entries), MaxListEntries)
	}
	for _, e := range r.Entries {
		if err := checkEntry(e); err != nil {
			return nil, err
		}
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
			st.writeWithin(c.opts.CallTimeout)
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
			st.writeWithin(c.opts.CallTimeout)
			_ = WriteJSON(st, FrameEnd, End{Error: rerr.Error()})
			st.readWithin(c.opts.CallTimeout)
			<-res
			return sent, fmt.Errorf("write %s: read source: %w", path, rerr)
		}
	}
	if upErr == nil {
		st.writeWithin(c.opts.CallTimeout)
		upErr = WriteJSON(st, FrameEnd, End{})
	}
	// The upload is over (or failed): the answer is due now.
	st.readWithin(c.opts.CallTimeout)
	if err := <-res; err != nil {
		return sent, c.streamErr(ctx, OpWriteFile, err)
	}
	if err := resultErr(OpWriteFile, path, result); err != nil {
		return sent, err
	}
	if upErr != nil {
		return sent, c.streamErr(ctx, OpWriteFile, upErr)
	}
	if result.Size < 0 || result.Size > sent {
		return sent, protoErr("write answered size %d for %d bytes sent", result.Size, sent)
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
	st.readWithin(c.opts.CallTimeout)
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
		if err := checkInfo(fi); err != nil {
			done()
			return nil, FileInfo{}, err
		}
		return &fileReader{ctx: ctx, c: c, st: st, done: done, path: path}, fi, nil
	}
	done()
	return nil, FileInfo{}, fmt.Errorf("%w: unexpected frame %d", ErrProtocol, t)
}

// fileReader streams a transfer's Data frames. Each frame must arrive
// within CallTimeout of asking for it; how long the consumer takes between
// reads is its own business.
type fileReader struct {
	ctx  context.Context
	c    *Client
	st   *opStream
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
		f.st.readWithin(f.c.opts.CallTimeout)
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
				f.err = fmt.Errorf("read %s: %s", f.path, CleanText(e.Error))
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
					st.cancel()
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
	// The process's start is due within CallTimeout; from then on the
	// stream lives as long as the process.
	st.readWithin(c.opts.CallTimeout)
	for started := false; ; {
		t, payload, err := ReadFrame(st)
		if err != nil {
			if ctx.Err() != nil {
				return Exit{}, fmt.Errorf("exec: %w", ctx.Err())
			}
			return Exit{}, c.streamErr(ctx, OpExec, err)
		}
		if !started {
			started = true
			st.readWithin(0)
		}
		switch t {
		case FrameStarted:
			var s Started
			if err := json.Unmarshal(payload, &s); err != nil || s.PID <= 0 || s.PID > MaxPID {
				return Exit{}, protoErr("exec started with %.64q", payload)
			}
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
			if err := checkExit(e); err != nil {
				return Exit{}, err
			}
			e.Error = CleanText(e.Error)
			if ctx.Err() != nil {
				return e, fmt.Errorf("exec: %w", ctx.Err())
			}
			return e, nil
		default:
			return Exit{}, fmt.Errorf("%w: unexpected frame %d in exec", ErrProtocol, t)
		}
	}
}
