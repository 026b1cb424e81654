package guest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/yamux"
	"golang.org/x/net/http2"
)

// The agent's plain HTTP endpoints, next to its Connect services (the
// shape of envd's: a file's bytes are a request or response body).
const (
	// FilesPath: GET ?path=P streams the file; POST ?path=P[&mode=0644]
	// replaces it atomically with the body (application/octet-stream, or
	// the first part of a multipart/form-data body), creating parents.
	FilesPath = "/files"
	// HealthPath answers 204 while the agent serves.
	HealthPath = "/health"
	// ErrorKindHeader classifies an error answer of /files so the host can
	// map it to a typed error: one of the Kind constants.
	ErrorKindHeader = "Sandboxd-Error-Kind"
)

// Error kinds carried in ErrorKindHeader.
const (
	KindNotFound = "not_found"
	KindIsDir    = "is_dir"
	KindOther    = "other"
)

// baseURL is what the host's requests are addressed to: the stream is the
// only way there, so the host name only has to be valid.
const baseURL = "http://agent"

// Messages cross a socket on one machine, where gzip costs CPU and saves
// nothing: both sides remove it (Connect registers it by default).
var (
	clientNoCompression = connect.WithAcceptCompression("gzip", nil, nil)
	// HandlerNoCompression is the agent's side of it.
	HandlerNoCompression = connect.WithCompression("gzip", nil, nil)
)

// streamTransport carries each HTTP request on a yamux stream of its own,
// as a one-request HTTP/2 cleartext connection: requests share nothing but
// the session, so a long exec stream never stands in a file transfer's way.
type streamTransport struct {
	sess *yamux.Session
	h2   *http2.Transport
}

func newStreamTransport(sess *yamux.Session) *streamTransport {
	return &streamTransport{sess: sess, h2: &http2.Transport{
		AllowHTTP: true,
		// Headers come from the agent: keep them small.
		MaxHeaderListSize: 64 << 10,
	}}
}

func (t *streamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	st, err := t.sess.OpenStream()
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		if t.sess.IsClosed() {
			return nil, ErrClosed
		}
		return nil, err
	}
	cc, err := t.h2.NewClientConn(st)
	if err != nil {
		st.Close()
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := cc.RoundTrip(req)
	if err != nil {
		cc.Close()
		return nil, err
	}
	resp.Body = &connBody{ReadCloser: resp.Body, cc: cc}
	return resp, nil
}

// connBody ends the request's connection (and its stream) with its body.
type connBody struct {
	io.ReadCloser
	cc   *http2.ClientConn
	once sync.Once
}

func (b *connBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { _ = b.cc.Close() })
	return err
}

// StreamServer is the agent's side of the transport: it serves the one
// HTTP/2 connection on each stream the host opens.
type StreamServer struct {
	h2      *http2.Server
	handler http.Handler
	base    *http.Server
}

// NewStreamServer serves handler on streams.
func NewStreamServer(handler http.Handler, log *slog.Logger) *StreamServer {
	return &StreamServer{
		h2: &http2.Server{
			MaxConcurrentStreams: 16,
			MaxReadFrameSize:     1 << 20,
			IdleTimeout:          time.Minute,
		},
		handler: handler,
		base:    &http.Server{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)},
	}
}

// ServeConn serves conn until the host closes it or ctx ends.
func (s *StreamServer) ServeConn(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	s.h2.ServeConn(conn, &http2.ServeConnOpts{Context: ctx, Handler: s.handler, BaseConfig: s.base})
}
