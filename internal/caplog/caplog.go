// Package caplog writes a log file that never grows past a set size: it
// keeps the first half of what was written and the most recent part of the
// rest, with a marker line between them saying how many bytes were dropped.
// Logs fed by sandboxes (a run's output, a guest's console) go through it,
// so that a guest printing forever cannot fill the host's disk.
//
// The file is always readable as it stands: head, then (once something was
// dropped) the marker, then the tail, in order. Open continues a file an
// earlier process left, so a log stays bounded across sandboxd restarts.
package caplog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
)

// MinSize is the smallest cap: room for a head, the marker and a tail.
const MinSize = 4 * markerLen

// DefaultSize is the cap of the logs sandboxd keeps when its operator sets
// none (--log-max-mib): tens of MiB keep a long run's head and tail.
const DefaultSize = 16 << 20

// markerLen is the marker line's fixed length, so that it can be rewritten
// in place as the dropped count grows.
const markerLen = 64

const markerPrefix = "\n[sandboxd: log truncated: "

// marker is the line between head and tail, padded to markerLen.
func marker(dropped int64) []byte {
	s := fmt.Sprintf("%s%d bytes dropped here]", markerPrefix, dropped)
	b := bytes.Repeat([]byte{' '}, markerLen)
	copy(b, s)
	b[markerLen-1] = '\n'
	return b
}

// parseMarker reads a marker back; ok is false when b is not one.
func parseMarker(b []byte) (dropped int64, ok bool) {
	if len(b) != markerLen || b[markerLen-1] != '\n' || !bytes.HasPrefix(b, []byte(markerPrefix)) {
		return 0, false
	}
	if _, err := fmt.Sscanf(string(b[len(markerPrefix):]), "%d bytes dropped here]", &dropped); err != nil || dropped < 0 {
		return 0, false
	}
	return dropped, true
}

// Writer is a capped log file. It is safe for concurrent use. Writes
// report the whole chunk written (what is dropped is counted, not refused);
// they fail only when the file cannot be written.
type Writer struct {
	mu      sync.Mutex
	f       *os.File
	max     int64
	head    int64 // bytes kept at the start: max/2
	size    int64 // current file size
	dropped int64
	copyBuf []byte
}

// Open opens (creating it, mode 0600) the capped log at path with a cap of
// max bytes (at least MinSize; 0 or less: DefaultSize). A file left by an
// earlier Writer is continued where it ended; a longer file from elsewhere
// is cut to the cap.
func Open(path string, max int64) (*Writer, error) {
	if max <= 0 {
		max = DefaultSize
	}
	if max < MinSize {
		max = MinSize
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	w := &Writer{f: f, max: max, head: max / 2}
	if err := w.recover(); err != nil {
		f.Close()
		return nil, fmt.Errorf("open log %s: %w", path, err)
	}
	return w, nil
}

// recover reads the state of an existing file.
func (w *Writer) recover() error {
	st, err := w.f.Stat()
	if err != nil {
		return err
	}
	w.size = st.Size()
	if w.size > w.head+markerLen {
		b := make([]byte, markerLen)
		if _, err := w.f.ReadAt(b, w.head); err != nil {
			return err
		}
		if d, ok := parseMarker(b); ok {
			w.dropped = d
		}
	}
	if w.size > w.max {
		// Not ours, or written with a larger cap: keep the head and count
		// the rest as dropped.
		w.dropped += w.size - w.head
		if err := w.f.Truncate(w.head); err != nil {
			return err
		}
		if err := w.writeMarker(); err != nil {
			return err
		}
		w.size = w.head + markerLen
	}
	return nil
}

// tailStart is where the tail begins: after the head, and after the marker
// once there is one.
func (w *Writer) tailStart() int64 {
	if w.dropped > 0 {
		return w.head + markerLen
	}
	return w.head
}

// Write implements io.Writer.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return 0, os.ErrClosed
	}
	n := len(p)
	// Straight appends while they fit.
	if w.size+int64(len(p)) <= w.max {
		if _, err := w.f.WriteAt(p, w.size); err != nil {
			return 0, fmt.Errorf("write log: %w", err)
		}
		w.size += int64(len(p))
		return n, nil
	}
	// The head first, if it is not full yet.
	if w.size < w.head {
		k := w.head - w.size
		if _, err := w.f.WriteAt(p[:k], w.size); err != nil {
			return 0, fmt.Errorf("write log: %w", err)
		}
		w.size = w.head
		p = p[k:]
	}
	if err := w.appendTail(p); err != nil {
		return 0, err
	}
	return n, nil
}

// appendTail adds p to the tail, dropping the oldest tail bytes so that
// the file stays within max. The tail is cut to half its room at a time,
// so each byte is moved at most once on average.
func (w *Writer) appendTail(p []byte) error {
	room := w.max - w.head - markerLen // the tail's room once marked
	if w.dropped > 0 && w.size+int64(len(p)) <= w.max {
		if _, err := w.f.WriteAt(p, w.size); err != nil {
			return fmt.Errorf("write log: %w", err)
		}
		w.size += int64(len(p))
		return nil
	}
	start := w.tailStart()
	old := w.size - start
	keep := room / 2 // what stays of old tail and p together
	if int64(len(p)) >= keep {
		w.dropped += old + int64(len(p)) - keep
		p = p[int64(len(p))-keep:]
		old = 0
	} else {
		keepOld := min(old, keep-int64(len(p)))
		w.dropped += old - keepOld
		if err := w.moveDown(start+old-keepOld, w.head+markerLen, keepOld); err != nil {
			return err
		}
		old = keepOld
	}
	dst := w.head + markerLen + old
	if _, err := w.f.WriteAt(p, dst); err != nil {
		return fmt.Errorf("write log: %w", err)
	}
	w.size = dst + int64(len(p))
	if err := w.f.Truncate(w.size); err != nil {
		return fmt.Errorf("truncate log: %w", err)
	}
	return w.writeMarker()
}

// moveDown copies n bytes from src to dst <= src; copying forward chunk by
// chunk is safe for overlapping regions in that direction.
func (w *Writer) moveDown(src, dst, n int64) error {
	if src == dst || n == 0 {
		return nil
	}
	if w.copyBuf == nil {
		w.copyBuf = make([]byte, 256<<10)
	}
	for off := int64(0); off < n; {
		c := min(int64(len(w.copyBuf)), n-off)
		b := w.copyBuf[:c]
		if _, err := w.f.ReadAt(b, src+off); err != nil {
			return fmt.Errorf("move log tail: %w", err)
		}
		if _, err := w.f.WriteAt(b, dst+off); err != nil {
			return fmt.Errorf("move log tail: %w", err)
		}
		off += c
	}
	return nil
}

func (w *Writer) writeMarker() error {
	if _, err := w.f.WriteAt(marker(w.dropped), w.head); err != nil {
		return fmt.Errorf("write log marker: %w", err)
	}
	return nil
}

// Dropped is how many bytes were dropped between head and tail so far.
func (w *Writer) Dropped() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped
}

// Max is the cap in bytes.
func (w *Writer) Max() int64 { return w.max }

// Note says, for a person, what happened to the log ("" when nothing was
// dropped).
func (w *Writer) Note() string {
	d := w.Dropped()
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("the log was capped at %d bytes: it keeps the first %d bytes and the last ones; %d bytes in between were dropped", w.max, w.head, d)
}

// Close closes the file.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}

// ReadFrom copies r into the log until EOF or a read error, which it
// returns (nil at EOF). It is how a stream from a guest is drained.
func (w *Writer) ReadFrom(r io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
