package guest

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/yamux"
)

// The agent's plain HTTP endpoints, next to its Connect services (the
// shape of envd's: a file's bytes are a request or response body).
const (
	// FilesPath: GET ?path=P streams the file; POST ?path=P[&mode=0644]
	// replaces it atomically with the body (application/octet-stream),
	// creating parents, and answers a JSON list of the files written. As
	// envd's, a POST may instead carry a multipart/form-data body of
	// several files (parts named "file", each at P or else at its file
	// name), and a Content-Encoding: gzip body, bounded in what it
	// decompresses to (413 past it).
	FilesPath = "/files"
	// UnpackPath: POST ?path=DIR writes the tar archive of the body into
	// DIR, made when missing, and answers what it wrote as JSON. Only the
	// host's own requests (no UserHeader) are served: it is not envd's.
	UnpackPath = "/sandboxd/unpack"
	// CodePath is the code interpreter (package codeint): under it, E2B's
	// code-interpreter API (/health, /execute, /contexts...). A request
	// acts as UserHeader's user; CodeEnvHeader and CodeDirHeader give the
	// environment and directory of the contexts it starts.
	CodePath = "/code"
	// CodeEnvHeader carries NAME=value variables (one a header value)
	// that a code context started by the request has beside the
	// sandbox's and the user's: the template's and E2B's envVars.
	CodeEnvHeader = "Sandboxd-Code-Env"
	// CodeDirHeader is the directory a code context starts in when the
	// request names none (the template's WORKDIR); default the user's
	// home.
	CodeDirHeader = "Sandboxd-Code-Dir"
	// HealthPath answers 204 while the agent serves.
	HealthPath = "/health"
	// ErrorKindHeader classifies an error answer of /files so the host can
	// map it to a typed error: one of the Kind constants.
	ErrorKindHeader = "Sandboxd-Error-Kind"
	// UserHeader names the sandbox user (in its /etc/passwd) a request of
	// the process or filesystem service or of /files acts as: a process
	// runs as that user (its groups, HOME, USER and LOGNAME; in its home
	// without a cwd), relative paths (a cwd too) resolve against its home,
	// and file operations are done with its credentials, so the kernel
	// checks its permissions (403 / PermissionDenied) and what they create
	// is its own. Only the host sets it; without it the agent acts as
	// itself (root).
	UserHeader = "Sandboxd-User"
	// EnvdHeader, set by the host's E2B front end on what it forwards,
	// asks the filesystem service for envd's own answers where they
	// differ from sandboxd's: an entry's mode is its permission bits (a
	// symbolic link's, its target's), its type and symlink target are
	// the resolved target's, and removing a path that does not exist
	// succeeds. sandboxd's own callers (file copies) need the full mode
	// and the link's own text, so they do not set it.
	EnvdHeader = "Sandboxd-Envd"
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

// newTransport carries HTTP requests to the agent as HTTP/2 cleartext
// streams on connections that are yamux streams of the session. Requests
// share connections (HTTP/2 multiplexes them, each with its own flow
// control, so a slow exec consumer holds up no other request): a
// connection of its own per request measured 2× the round trip of a
// request that forks nothing (see bench/README.md).
func newTransport(sess *yamux.Session) *http.Transport {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Transport{
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
		IdleConnTimeout:        5 * time.Minute,
		// An output event (at most 256 KiB) crosses as one DATA frame
		// instead of 16 KiB ones, each its own writes on the socket; what
		// a stream may hold unread is 1 MiB where the default is 4, so a
		// hostile agent makes the host buffer less.
		HTTP2: &http.HTTP2Config{
			MaxReadFrameSize:          256 << 10,
			MaxReceiveBufferPerStream: 1 << 20,
		},
	}
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
			MaxConcurrentStreams: 250,
			MaxReadFrameSize:     1 << 20,
		},
		// Longer than the host transport's IdleConnTimeout, so that the
		// host closes an idle connection (cleanly) before the agent would:
		// a sandbox started ahead keeps the connection its start opened
		// while it waits.
		IdleTimeout: 10 * time.Minute,
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
