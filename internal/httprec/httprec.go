// Package httprec wraps an http.ResponseWriter to remember the status an
// answer was sent with and count its body's bytes, for logs and metrics,
// while letting streaming handlers flush through it
// (http.ResponseController finds the real writer with Unwrap).
package httprec

import "net/http"

// Recorder is the wrapping writer. Status is 0 until the header is sent.
type Recorder struct {
	http.ResponseWriter
	Status int
	Bytes  int64
}

// WriteHeader implements http.ResponseWriter.
func (r *Recorder) WriteHeader(code int) {
	if r.Status == 0 {
		r.Status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (r *Recorder) Write(b []byte) (int, error) {
	if r.Status == 0 {
		r.Status = http.StatusOK
	}
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
	if r.Status == 0 {
		r.Status = http.StatusOK
	}
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}
