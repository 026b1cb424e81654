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
	h    *http.Transport
}

func newStreamTransport(sess *yamux.Session) *streamTransport {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &streamTransport{sess: sess, h: &http.Transport{
		Protocols: &p,
		DialContext: func(context.Context, string, string) (net.Conn, error) {
			st, err := sess.OpenStream()
			if err != nil && sess.IsClosed() {
				return nil, ErrClosed
			}
			return st, err
		},
		// Headers come from the agent: keep them small.
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
	}}
}

func (t *streamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	cc, err := t.h.NewClientConn(req.Context(), "http", "agent:80")
	if err != nil {
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
	cc   *http.ClientConn
	once sync.Once
}

func (b *connBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { _ = b.cc.Close() })
	return err
}

// ServeSession is the agent's side of the transport: it serves handler on
// every stream the host opens on sess, each an HTTP/2 cleartext
// connection, until the session ends.
func ServeSession(sess *yamux.Session, handler http.Handler, log *slog.Logger) error {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:   handler,
		Protocols: &p,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: 16,
			MaxReadFrameSize:     1 << 20,
		},
		IdleTimeout: time.Minute,
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	defer srv.Close()
	// The session is the listener: each accepted stream is a connection.
	err := srv.Serve(sess)
	if sess.IsClosed() {
		return nil
	}
	return err
}
