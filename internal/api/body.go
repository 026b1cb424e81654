package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/sandboxd/sandboxd/internal/edge"
)

// Defaults of Options.BodyIdleTimeout and Options.BodyTimeout.
const (
	// DefaultBodyIdleTimeout is how long a request body may send nothing.
	DefaultBodyIdleTimeout = 30 * time.Second
	// DefaultBodyTimeout is how long a request body may take in all: a
	// 1 GiB multipart upload at 2 MiB/s.
	DefaultBodyTimeout = 10 * time.Minute
)

// bodyLimits are the read deadlines of request bodies; 0 is none.
type bodyLimits struct {
	idle, total time.Duration
}

// orDefault is a deadline of Options: 0 is the default, negative none.
func orDefault(d, def time.Duration) time.Duration {
	switch {
	case d == 0:
		return def
	case d < 0:
		return 0
	}
	return d
}

// withBodyDeadline cuts off a request body that stalls or trickles: each
// read must bring something within the idle deadline, and the whole body
// must have arrived within the total one. A body is read into temporary
// files (uploads) or memory (JSON) while the handler waits for it, so a
// client that keeps a body open would otherwise hold both for as long as
// it likes. A body cut off answers 408 (writeError).
func (s *Server) withBodyDeadline(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || (s.body.idle <= 0 && s.body.total <= 0) {
			next(w, r)
			return
		}
		b := &deadlineBody{ReadCloser: r.Body, rc: http.NewResponseController(w), limits: s.body}
		if s.body.total > 0 {
			b.end = time.Now().Add(s.body.total)
		}
		r.Body = b
		next(w, r.WithContext(context.WithValue(r.Context(), bodyKey, b)))
	}
}

// deadlineBody is a request body whose reads have deadlines on the
// connection.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	limits bodyLimits
	end    time.Time // of the whole body; zero: none
	ended  bool      // a read failed or the body ended: no more deadlines
	// cut is the deadline that cut the body off, once one did.
	cut atomic.Pointer[edge.Error]
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	if b.ended {
		return b.ReadCloser.Read(p)
	}
	deadline, total := b.next()
	// Without deadlines on this connection (a recorder in tests) the body
	// is read as it comes.
	_ = b.rc.SetReadDeadline(deadline)
	n, err := b.ReadCloser.Read(p)
	if err == nil {
		return n, nil
	}
	b.ended = true
	// The deadlines are the body's: after it the connection is only
	// watched for a client that goes away, and one that fired then would
	// end the request as if it had (net/http's HTTP/1 server clears the
	// deadline itself before that watch; this does not rely on it).
	_ = b.rc.SetReadDeadline(time.Time{})
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.cut.Store(b.timeout(total))
	}
	return n, err
}

// next is the deadline of the next read, and whether it is the whole
// body's.
func (b *deadlineBody) next() (time.Time, bool) {
	if b.limits.idle <= 0 {
		return b.end, true
	}
	idle := time.Now().Add(b.limits.idle)
	if !b.end.IsZero() && b.end.Before(idle) {
		return b.end, true
	}
	return idle, false
}

// timeout is the answer to a body cut off by the whole body's deadline
// (total) or the idle one.
func (b *deadlineBody) timeout(total bool) *edge.Error {
	msg := fmt.Sprintf("Request body timed out: nothing arrived for %v", b.limits.idle)
	if total {
		msg = fmt.Sprintf("Request body timed out: it had not all arrived after %v", b.limits.total)
	}
	return &edge.Error{Status: http.StatusRequestTimeout, Msg: msg}
}

// bodyTimeout is the answer to r when a deadline cut its body off, or nil.
func bodyTimeout(r *http.Request) *edge.Error {
	b, _ := r.Context().Value(bodyKey).(*deadlineBody)
	if b == nil {
		return nil
	}
	return b.cut.Load()
}
