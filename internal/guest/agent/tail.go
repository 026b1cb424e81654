package agent

// tail keeps the last bytes of one output stream of a process (at most
// max), so a caller that comes back can have what it missed, and counts
// every byte the stream ever carried, so it can ask from where it stopped.
// Not safe for concurrent use; process.mu guards it.
type tail struct {
	buf   []byte // grows to max, then is used as a ring
	max   int
	start int    // index of the oldest byte once the ring is full
	total uint64 // bytes written since the process started
}

func (t *tail) write(p []byte) {
	t.total += uint64(len(p))
	if t.max <= 0 {
		return
	}
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		t.start = 0
		return
	}
	if len(t.buf) < t.max {
		n := min(t.max-len(t.buf), len(p))
		t.buf = append(t.buf, p[:n]...)
		p = p[n:]
	}
	for len(p) > 0 {
		n := copy(t.buf[t.start:], p)
		p = p[n:]
		t.start = (t.start + n) % t.max
	}
}

// from returns a copy of the kept bytes from offset off on (from the
// oldest kept byte when off is older) and the offset they begin at.
func (t *tail) from(off uint64) ([]byte, uint64) {
	oldest := t.total - uint64(len(t.buf))
	off = max(off, oldest)
	if off >= t.total {
		return nil, t.total
	}
	out := make([]byte, 0, len(t.buf))
	out = append(out, t.buf[t.start:]...)
	out = append(out, t.buf[:t.start]...)
	return out[off-oldest:], off
}
