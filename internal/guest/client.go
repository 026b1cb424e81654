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
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/yamux"
	"golang.org/x/time/rate"

	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem"
	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1/agentv1connect"
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

// The host takes at most agentStreamRate new streams (connections home) a
// second from the agent, in bursts of agentStreamBurst; beyond that yamux
// resets them unseen once its accept backlog is full. Home applies the
// sandbox's own limits to those it takes.
const (
	agentStreamRate  = 200
	agentStreamBurst = 400
)

// ClientOptions configure the host side of a connection.
type ClientOptions struct {
	// Home serves one connection a process in the sandbox opened to
	// sandboxd.internal (a stream the agent opened); it owns conn and
	// applies the sandbox's limits. Nil refuses such streams.
	Home func(conn net.Conn)
	// HandshakeTimeout bounds the handshake (default 10s).
	HandshakeTimeout time.Duration
	// Secret, when set, must be proved by the agent in the handshake (a
	// Welcome's challenge); a peer that cannot is refused with
	// ErrUnauthenticated.
	Secret []byte
	// CallTimeout bounds every request/response call and, in streamed
	// transfers (file reads and writes, layer exports), each wait for
	// progress, so an agent that stops answering cannot hold a host
	// goroutine (default DefaultCallTimeout). Process streams live as long
	// as their process; only their start is bounded.
	CallTimeout time.Duration
	Logger      *slog.Logger
}

// Client is the host's typed handle on one agent connection. It is safe for
// concurrent use; every call is an HTTP/2 request of its own.
type Client struct {
	hello Hello
	sess  *yamux.Session
	opts  ClientOptions
	log   *slog.Logger
	wg    sync.WaitGroup

	http  *http.Client
	proc  processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
	agent agentv1connect.AgentClient
}

func newClient(h Hello, sess *yamux.Session, opts ClientOptions, log *slog.Logger) *Client {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	hc := &http.Client{Transport: newTransport(sess)}
	copts := []connect.ClientOption{clientNoCompression, connect.WithReadMaxBytes(MaxMessage)}
	c := &Client{
		hello: h, sess: sess, opts: opts, log: log, http: hc,
		proc:  processconnect.NewProcessClient(hc, baseURL, copts...),
		fs:    filesystemconnect.NewFilesystemClient(hc, baseURL, copts...),
		agent: agentv1connect.NewAgentClient(hc, baseURL, copts...),
	}
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
	_ = conn.SetDeadline(time.Now().Add(opts.HandshakeTimeout))
	var hm agentv1.Hello
	if err := ReadMessage(conn, &hm); err != nil {
		conn.Close()
		return nil, fmt.Errorf("read agent hello: %w", err)
	}
	h := helloFrom(&hm)
	w := &agentv1.Welcome{Protocol: Protocol}
	if h.Protocol != Protocol {
		w.Error = fmt.Sprintf("host speaks protocol %d, agent %d", Protocol, h.Protocol)
	} else if err := CheckHello(h); err != nil {
		w.Error = err.Error()
	}
	if w.Error == "" && len(opts.Secret) > 0 {
		w.Challenge = make([]byte, ChallengeSize)
		_, _ = rand.Read(w.Challenge)
	}
	if err := WriteMessage(conn, w); err != nil {
		conn.Close()
		return nil, fmt.Errorf("write welcome: %w", err)
	}
	if w.Error != "" {
		conn.Close()
		return nil, fmt.Errorf("%w: %s", ErrProtocol, w.Error)
	}
	if w.Challenge != nil {
		var p agentv1.Proof
		if err := ReadMessage(conn, &p); err != nil {
			conn.Close()
			return nil, fmt.Errorf("%w: read proof: %v", ErrUnauthenticated, err)
		}
		if !hmac.Equal(p.GetMac(), ProofMAC(opts.Secret, w.Challenge)) {
			conn.Close()
			return nil, fmt.Errorf("%w: wrong proof from pid %d", ErrUnauthenticated, h.PID)
		}
	}
	_ = conn.SetDeadline(time.Time{})
	return startSession(conn, h, opts)
}

// startSession runs yamux on conn after a completed handshake.
func startSession(conn net.Conn, h Hello, opts ClientOptions) (*Client, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	sess, err := yamux.Client(conn, YamuxConfig())
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start session: %w", err)
	}
	return newClient(h, sess, opts, log), nil
}

// Hello returns what the agent said about itself.
func (c *Client) Hello() Hello { return c.hello }

// Transport carries HTTP requests to the agent: for callers that speak
// the agent's API themselves (a forwarder of envd-shaped requests). Any
// host name in a request's URL reaches the agent.
func (c *Client) Transport() http.RoundTripper { return c.http.Transport }

// Done is closed when the session ends.
func (c *Client) Done() <-chan struct{} { return c.sess.CloseChan() }

// Close ends the session; running operations fail with ErrClosed.
func (c *Client) Close() error {
	err := c.sess.Close()
	c.wg.Wait()
	return err
}

// acceptLoop hands the streams the agent opens, connections home, to
// Home, at a bounded rate.
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
		if c.opts.Home == nil {
			c.log.Debug("agent stream refused: no way home")
			st.Close()
			continue
		}
		go c.opts.Home(st)
	}
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

// fail explains a failed call: cancellation, an agent that stopped
// answering, a dead session, or the agent's own error (not-found errors
// wrap fs.ErrNotExist so callers can test with errors.Is).
func (c *Client) fail(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrNoAnswer) || errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%s: %w (%s)", op, ErrNoAnswer, c.opts.CallTimeout)
	}
	if c.sess.IsClosed() || errors.Is(err, ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		switch ce.Code() {
		case connect.CodeNotFound:
			return fmt.Errorf("%s: %s: %w", op, CleanText(ce.Message()), fs.ErrNotExist)
		case connect.CodeDeadlineExceeded:
			return fmt.Errorf("%s: %w (%s)", op, ErrNoAnswer, c.opts.CallTimeout)
		case connect.CodeResourceExhausted:
			// A message past the read limit (the agent's own refusals
			// of that kind do not reach these calls).
			return fmt.Errorf("%w: %s: %s", ErrProtocol, op, CleanText(ce.Message()))
		case connect.CodeUnavailable, connect.CodeCanceled:
			if c.sess.IsClosed() {
				return fmt.Errorf("%s: %w", op, ErrClosed)
			}
		}
		return fmt.Errorf("%s: %s (%s)", op, CleanText(ce.Message()), ce.Code())
	}
	return fmt.Errorf("%s: %w", op, err)
}

// unary makes one request/response call that must be answered within
// CallTimeout.
func unary[Req, Res any](ctx context.Context, c *Client, op string, call func(context.Context, *connect.Request[Req]) (*connect.Response[Res], error), req *Req) (*Res, error) {
	cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	defer cancel()
	resp, err := call(cctx, connect.NewRequest(req))
	if err != nil {
		return nil, c.fail(ctx, op, err)
	}
	return resp.Msg, nil
}

// Ping asks the agent how it is.
func (c *Client) Ping(ctx context.Context) (Health, error) {
	r, err := unary(ctx, c, "health", c.agent.Health, &agentv1.HealthRequest{})
	if err != nil {
		return Health{}, err
	}
	h := Health{Uptime: r.GetUptimeSeconds(), Processes: int(r.GetProcesses()), MemTotal: r.GetMemTotal(), MemFree: r.GetMemFree()}
	if err := checkHealth(h); err != nil {
		return Health{}, err
	}
	return h, nil
}

// Sync flushes the sandbox's filesystems to the host.
func (c *Client) Sync(ctx context.Context) error {
	_, err := unary(ctx, c, "sync", c.agent.Sync, &agentv1.SyncRequest{})
	return err
}

// OOMKill kills the process using the most memory inside the sandbox.
func (c *Client) OOMKill(ctx context.Context) (Killed, error) {
	r, err := unary(ctx, c, "oom kill", c.agent.OOMKill, &agentv1.OOMKillRequest{})
	if err != nil {
		return Killed{}, err
	}
	k := Killed{PID: int(r.GetPid()), Name: r.GetName(), RSS: r.GetRss()}
	if err := checkKilled(k); err != nil {
		return Killed{}, err
	}
	k.Name = CleanText(k.Name)
	return k, nil
}

// ListDir lists a directory: at most MaxListEntries entries, each a plain
// name (no "/", not "." or "..").
func (c *Client) ListDir(ctx context.Context, path string) ([]FileInfo, error) {
	r, err := unary(ctx, c, "list "+path, c.fs.ListDir, &filesystem.ListDirRequest{Path: path, Depth: 1})
	if err != nil {
		return nil, err
	}
	if len(r.GetEntries()) > MaxListEntries {
		return nil, protoErr("listing of %d entries (at most %d)", len(r.GetEntries()), MaxListEntries)
	}
	out := make([]FileInfo, 0, len(r.GetEntries()))
	for _, e := range r.GetEntries() {
		fi := FileInfo{Name: e.GetName(), Size: e.GetSize(), Mode: e.GetMode(), ModTime: e.GetModifiedTime().AsTime(), Link: e.GetSymlinkTarget()}
		if err := checkEntry(fi); err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

// watchdog cancels an operation that makes no progress for d: every kick
// restarts the wait.
type watchdog struct {
	t     *time.Timer
	d     time.Duration
	fired chan struct{}
}

func newWatchdog(d time.Duration, cancel context.CancelFunc) *watchdog {
	w := &watchdog{d: d, fired: make(chan struct{})}
	w.t = time.AfterFunc(d, func() { close(w.fired); cancel() })
	return w
}

func (w *watchdog) kick() { w.t.Reset(w.d) }

func (w *watchdog) stop() { w.t.Stop() }

// barked says whether the watchdog cancelled the operation.
func (w *watchdog) barked() bool {
	select {
	case <-w.fired:
		return true
	default:
		return false
	}
}

// progressReader kicks its watchdog on every read and keeps the source's
// own error apart from the transfer's.
type progressReader struct {
	r   io.Reader
	w   *watchdog
	n   int64
	err error
}

func (p *progressReader) Read(b []byte) (int, error) {
	p.w.kick()
	n, err := p.r.Read(b)
	p.n += int64(n)
	if err != nil && err != io.EOF {
		p.err = err
	}
	return n, err
}

// filesURL addresses the agent's /files endpoint for path.
func filesURL(path string, extra url.Values) string {
	q := url.Values{"path": {path}}
	for k, v := range extra {
		q[k] = v
	}
	return baseURL + FilesPath + "?" + q.Encode()
}

// filesError turns an error answer of /files into an error.
func filesError(op, path string, resp *http.Response) error {
	var body struct {
		Message string `json:"message"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 16<<10)).Decode(&body)
	switch resp.Header.Get(ErrorKindHeader) {
	case KindNotFound:
		return fmt.Errorf("%s %s: %w", op, path, fs.ErrNotExist)
	case KindIsDir:
		return fmt.Errorf("%s %s: %w", op, path, syscall.EISDIR)
	}
	return fmt.Errorf("%s %s: %s (HTTP %d)", op, path, CleanText(body.Message), resp.StatusCode)
}

// WriteFile replaces path with the content of r (atomically: the agent
// writes a temporary file and renames it), creating parent directories.
// A source that fails midway leaves nothing behind.
func (c *Client) WriteFile(ctx context.Context, path string, mode fs.FileMode, r io.Reader) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd := newWatchdog(c.opts.CallTimeout, cancel)
	defer wd.stop()
	body := &progressReader{r: r, w: wd}
	req, err := http.NewRequestWithContext(wctx, http.MethodPost, filesURL(path, url.Values{"mode": {strconv.FormatUint(uint64(mode.Perm()), 8)}}), io.NopCloser(body))
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", path, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.http.Do(req)
	if body.err != nil {
		return body.n, fmt.Errorf("write %s: read source: %w", path, body.err)
	}
	if err != nil {
		if wd.barked() {
			err = ErrNoAnswer
		}
		return body.n, c.fail(ctx, "write "+path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return body.n, filesError("write", path, resp)
	}
	var written []struct {
		Size int64 `json:"size"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<10)).Decode(&written); err != nil || len(written) != 1 {
		return body.n, protoErr("write answered %d entries (%v)", len(written), err)
	}
	if written[0].Size < 0 || written[0].Size > body.n {
		return body.n, protoErr("write answered size %d for %d bytes sent", written[0].Size, body.n)
	}
	return written[0].Size, nil
}

// Unpack writes the tar archive r into the directory dir of the sandbox,
// made when missing (UnpackPath), in one request, and answers the files
// it wrote.
func (c *Client) Unpack(ctx context.Context, dir string, r io.Reader) (Unpacked, error) {
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wd := newWatchdog(c.opts.CallTimeout, cancel)
	defer wd.stop()
	body := &progressReader{r: r, w: wd}
	u := baseURL + UnpackPath + "?" + url.Values{"path": {dir}}.Encode()
	req, err := http.NewRequestWithContext(uctx, http.MethodPost, u, io.NopCloser(body))
	if err != nil {
		return Unpacked{}, fmt.Errorf("unpack into %s: %w", dir, err)
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.http.Do(req)
	if body.err != nil {
		return Unpacked{}, fmt.Errorf("unpack into %s: read source: %w", dir, body.err)
	}
	if err != nil {
		if wd.barked() {
			err = ErrNoAnswer
		}
		return Unpacked{}, c.fail(ctx, "unpack into "+dir, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Unpacked{}, filesError("unpack into", dir, resp)
	}
	var out Unpacked
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<10)).Decode(&out); err != nil {
		return Unpacked{}, protoErr("unpack answered %v", err)
	}
	return out, nil
}

// Unpacked is what an Unpack wrote.
type Unpacked struct {
	Files       int   `json:"files"`
	Directories int   `json:"directories"`
	Links       int   `json:"links"`
	Bytes       int64 `json:"bytes"`
}

// ReadFile opens path for reading. The returned reader streams the content;
// it fails with an error if the transfer breaks or stalls for CallTimeout.
// Close it when done.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	rctx, cancel := context.WithCancel(ctx)
	wd := newWatchdog(c.opts.CallTimeout, cancel)
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, filesURL(path, nil), nil)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		wd.stop()
		cancel()
		if wd.barked() {
			err = ErrNoAnswer
		}
		return nil, c.fail(ctx, "read "+path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer wd.stop()
		defer resp.Body.Close()
		return nil, filesError("read", path, resp)
	}
	return &watchedBody{ctx: ctx, c: c, body: resp.Body, wd: wd, cancel: cancel, op: "read " + path}, nil
}

// watchedBody is a response body whose every read must make progress
// within CallTimeout; how long the consumer takes between reads is its own
// business.
type watchedBody struct {
	ctx    context.Context
	c      *Client
	body   io.ReadCloser
	wd     *watchdog
	cancel context.CancelFunc
	op     string
}

func (b *watchedBody) Read(p []byte) (int, error) {
	b.wd.kick()
	n, err := b.body.Read(p)
	b.wd.t.Stop()
	if err != nil && err != io.EOF {
		if b.wd.barked() {
			err = ErrNoAnswer
		}
		return n, b.c.fail(b.ctx, b.op, err)
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.wd.stop()
	err := b.body.Close()
	b.cancel()
	return err
}
