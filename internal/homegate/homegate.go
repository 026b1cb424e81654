// Package homegate is the host end of http://sandboxd.internal for one
// sandbox. Every connection a process in the sandbox opens there arrives
// over the agent channel and is served here: an HTTP reverse proxy to the
// sandboxd API's unix socket (the git server, the model proxy, the API)
// under the sandbox's own limits — concurrent connections and a request
// rate — so that one sandbox cannot exhaust the API, its file descriptors
// or its goroutines for the others. A sandbox past its limits is answered
// 429; each sandbox has its own gate, so one at its cap does not slow
// another.
package homegate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Limits bound one sandbox's use of sandboxd.internal. Zero fields are
// unlimited.
type Limits struct {
	// MaxConns is how many connections the sandbox may hold open at once;
	// more are answered 429 and closed.
	MaxConns int
	// RequestsPerSecond is the sustained request rate, with bursts of
	// Burst requests (at least 1); requests beyond it are answered 429.
	RequestsPerSecond float64
	Burst             int
}

// Reasons a request or connection is refused, as the metric's label.
const (
	ReasonConns = "connections"
	ReasonRate  = "rate"
)

// Metrics count what the gates of one process refused. One Metrics serves
// every sandbox's gate (the sandbox is in the log line, not in a label, to
// keep the series few). It is a prometheus.Collector.
type Metrics struct {
	refused *prometheus.CounterVec
}

// NewMetrics returns the metrics; register them with a prometheus registry.
func NewMetrics() *Metrics {
	return &Metrics{refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandboxd_internal_refused_total",
		Help: "Connections and requests from sandboxes to sandboxd.internal refused (429) because the sandbox was past its limit, by limit.",
	}, []string{"reason"})}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { m.refused.Describe(ch) }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) { m.refused.Collect(ch) }

// Refused is the counter of refusals for reason.
func (m *Metrics) Refused(reason string) prometheus.Counter {
	return m.refused.WithLabelValues(reason)
}

// Options configure a Gate.
type Options struct {
	// Dial connects to the sandboxd API (its unix socket).
	Dial func(ctx context.Context) (net.Conn, error)
	// Sandbox names the sandbox in log lines; it may change (a warm
	// sandbox gets its id when it is handed out).
	Sandbox func() string
	Limits  Limits
	Metrics *Metrics // nil: not counted
	Logger  *slog.Logger
}

// Gate serves one sandbox's connections to sandboxd.internal.
type Gate struct {
	opts  Options
	log   *slog.Logger
	slots chan struct{} // nil: unlimited
	lim   *rate.Limiter // nil: unlimited
	ln    *connListener
	srv   *http.Server
	proxy *httputil.ReverseProxy
	tr    *http.Transport
	// refusedConns and refusedReqs count since the last log line, which is
	// written at most every logEvery so a sandbox hammering its limit
	// cannot flood the host's log.
	refusedConns, refusedReqs atomic.Int64
	lastLog                   atomic.Int64 // unix nanos
}

// logEvery is the longest interval between two refusal log lines of one gate.
const logEvery = 10 * time.Second

// New returns a gate serving connections handed to Serve until Close.
func New(opts Options) *Gate {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Sandbox == nil {
		opts.Sandbox = func() string { return "" }
	}
	g := &Gate{opts: opts, log: opts.Logger, ln: newConnListener()}
	if n := opts.Limits.MaxConns; n > 0 {
		g.slots = make(chan struct{}, n)
	}
	if r := opts.Limits.RequestsPerSecond; r > 0 {
		g.lim = rate.NewLimiter(rate.Limit(r), max(opts.Limits.Burst, 1))
	}
	g.tr = &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return opts.Dial(ctx) },
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	g.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "sandboxd.internal"
			pr.Out.Host = pr.In.Host // the API builds URLs from it
		},
		Transport:     g.tr,
		FlushInterval: -1, // model answers stream (server-sent events)
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == nil {
				g.log.Warn("sandboxd.internal: forward to the API", "sandbox", g.opts.Sandbox(), "err", err)
			}
			writeError(w, http.StatusBadGateway, "sandboxd API unavailable")
		},
	}
	g.srv = &http.Server{
		Handler:           http.HandlerFunc(g.serveHTTP),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	go func() { _ = g.srv.Serve(g.ln) }()
	return g
}

// Serve serves one connection from the sandbox; it owns conn. It returns
// at once: the connection is served in the background.
func (g *Gate) Serve(conn net.Conn) {
	if g.slots != nil {
		select {
		case g.slots <- struct{}{}:
		default:
			g.refused(ReasonConns)
			go refuseConn(conn, fmt.Sprintf("too many connections to sandboxd.internal from this sandbox (at most %d at once)", g.opts.Limits.MaxConns))
			return
		}
		conn = &slotConn{Conn: conn, release: func() { <-g.slots }}
	}
	if !g.ln.deliver(conn) {
		conn.Close()
	}
}

// Close stops serving and closes every connection.
func (g *Gate) Close() error {
	g.ln.Close()
	err := g.srv.Close()
	g.tr.CloseIdleConnections()
	return err
}

func (g *Gate) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if g.lim != nil && !g.lim.Allow() {
		g.refused(ReasonRate)
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("too many requests to sandboxd.internal from this sandbox (at most %g a second)", g.opts.Limits.RequestsPerSecond))
		return
	}
	g.proxy.ServeHTTP(w, r)
}

// refused counts a refusal and logs, at most every logEvery, how many
// there were.
func (g *Gate) refused(reason string) {
	if g.opts.Metrics != nil {
		g.opts.Metrics.refused.WithLabelValues(reason).Inc()
	}
	if reason == ReasonConns {
		g.refusedConns.Add(1)
	} else {
		g.refusedReqs.Add(1)
	}
	now := time.Now().UnixNano()
	last := g.lastLog.Load()
	if now-last < int64(logEvery) || !g.lastLog.CompareAndSwap(last, now) {
		return
	}
	g.log.Warn("sandbox past its sandboxd.internal limits: refused with 429", "sandbox", g.opts.Sandbox(),
		"connections_refused", g.refusedConns.Swap(0), "requests_refused", g.refusedReqs.Swap(0),
		"max_conns", g.opts.Limits.MaxConns, "requests_per_second", g.opts.Limits.RequestsPerSecond)
}

// refuseConn answers a connection over the cap with a 429 and closes it,
// without reading its request (it has no slot to be read in).
func refuseConn(conn net.Conn, msg string) {
	defer conn.Close()
	// Take in what the client has sent (its request head) first: closing
	// over unread bytes makes some stacks reset the connection before the
	// client reads the answer.
	_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	var head []byte
	buf := make([]byte, 4096)
	for len(head) < 16<<10 && !bytes.Contains(head, []byte("\r\n\r\n")) {
		n, err := conn.Read(buf)
		head = append(head, buf[:n]...)
		if err != nil {
			break
		}
	}
	body, _ := json.Marshal(map[string]string{"status": "error", "error": msg})
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = fmt.Fprintf(conn, "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// writeError writes the API's error body shape.
func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"status": "error", "error": msg})
}

// slotConn gives its connection slot back when closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// connListener is a net.Listener of the connections handed to Serve.
type connListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newConnListener() *connListener {
	return &connListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) deliver(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return addr{} }

type addr struct{}

func (addr) Network() string { return "sandboxd.internal" }
func (addr) String() string  { return "sandboxd.internal:80" }

// Only is h as the home socket serves it: the requests whose path is one
// of paths (a path ending in "/" is a prefix of the paths under it) reach
// h; any other is 404. sandboxd.internal leads to this server's API, git
// server, MCP and model proxy and nowhere else: in particular nothing
// there routes by Host (the E2B domain's PORT-ID hosts), which would give
// a sandbox without a network other sandboxes' ports and, through one
// with a network, the internet.
func Only(h http.Handler, paths ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, p := range paths {
			if !isClean(r.URL.Path) {
				break // "/api/../sandboxes" names what it is not under
			}
			if r.URL.Path == p || (strings.HasSuffix(p, "/") && strings.HasPrefix(r.URL.Path, p)) {
				h.ServeHTTP(w, r)
				return
			}
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("%s is not served at sandboxd.internal: it serves %s", r.URL.Path, strings.Join(paths, ", ")))
	})
}

// isClean reports whether p has no empty, "." or ".." elements.
func isClean(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}
