// Package httprec wraps an http.ResponseWriter to remember the status an
// answer was sent with, when its header went, and count its body's bytes,
// for logs and metrics, while letting streaming handlers flush through it
// (http.ResponseController finds the real writer with Unwrap).
package httprec

import (
	"net/http"
	"time"
)

// Recorder is the wrapping writer. Status is 0 until the header is sent.
type Recorder struct {
	http.ResponseWriter
	Status int
	// HeaderAt is when the header was sent (zero until then): how long a
	// streamed answer took to start, however long it then streams.
	HeaderAt time.Time
	Bytes    int64
}

// sent records the header going out with code, the first time.
func (r *Recorder) sent(code int) {
	if r.Status == 0 {
		r.Status, r.HeaderAt = code, time.Now()
	}
}

// WriteHeader implements http.ResponseWriter.
func (r *Recorder) WriteHeader(code int) {
	r.sent(code)
	r.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (r *Recorder) Write(b []byte) (int, error) {
	r.sent(http.StatusOK)
	n, err := r.ResponseWriter.Write(b)
	r.Bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach Flush on the real writer.
func (r *Recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Flush implements http.Flusher for handlers that look for it by type
// assertion rather than through http.ResponseController (connect-go's
// streams); a writer that cannot flush makes it a no-op, as it would be.
func (r *Recorder) Flush() {
	r.sent(http.StatusOK)
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}
