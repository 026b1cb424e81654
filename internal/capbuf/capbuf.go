// Package capbuf is a byte buffer that keeps at most a set number of bytes
// and counts the rest, so that a chatty command cannot exhaust the server's
// memory while its output is collected for an answer or a run record.
package capbuf

import (
	"fmt"
	"sync"
)

// Buffer keeps the first Max bytes written to it. It is safe for concurrent
// use; writes never fail.
type Buffer struct {
	mu      sync.Mutex
	buf     []byte
	max     int
	dropped int64
}

// New returns a Buffer that keeps at most max bytes.
func New(max int) *Buffer { return &Buffer{max: max} }

// Write implements io.Writer: it keeps what fits and counts the rest.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	keep := max(0, min(b.max-len(b.buf), len(p)))
	b.buf = append(b.buf, p[:keep]...)
	b.dropped += int64(len(p) - keep)
	return len(p), nil
}

// Dropped is how many bytes did not fit.
func (b *Buffer) Dropped() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.dropped
}

// String returns what was kept, followed by a note saying how much was
// dropped and where it went (note names it, e.g. "in the run log") when
// anything was.
func (b *Buffer) String(note string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped == 0 {
		return string(b.buf)
	}
	return string(b.buf) + fmt.Sprintf("\n[sandboxd: %d more bytes %s]\n", b.dropped, note)
}
