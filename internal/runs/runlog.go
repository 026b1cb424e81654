package runs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/sandboxd/sandboxd/internal/caplog"
	"github.com/sandboxd/sandboxd/internal/escstrip"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The command's output streams, indexes into runLog's counts.
const (
	streamStdout = iota
	streamStderr
)

var streamNames = [2]string{"stdout", "stderr"}

// runLog is a run's log file: each line tagged with its stream, capped
// to its head and tail, terminal escape sequences stripped. Next to it (.pos) it keeps how many bytes of each
// of the command's streams it has, so that a server that restarted and
// follows the command again (Reconcile) logs only what it did not have,
// and says so when the agent no longer had some of it.
type runLog struct {
	*caplog.Writer
	posPath string

	mu  sync.Mutex
	pos [2]uint64 // bytes of each stream in the log
	cur [2]uint64 // offset of the next byte the command's stream delivers
	// open is the tag of the line the log ends in the middle of; "" when
	// it ends a line.
	open string
	// strip removes terminal escape sequences from each of the command's
	// streams (their offsets above count what the command wrote); buf is
	// the stripped text of the current write.
	strip [2]escstrip.Stripper
	buf   []byte
}

// writeTagged writes b to the log with each line that starts in it tagged
// "[name] ". A line another stream left open is ended first, so that every
// line of the file is one stream's: output arrives in chunks that need not
// end lines, and stdout and stderr interleave. Callers hold mu.
func (l *runLog) writeTagged(name string, b []byte) error {
	var buf bytes.Buffer
	if l.open != "" && l.open != name {
		buf.WriteByte('\n')
		l.open = ""
	}
	for len(b) > 0 {
		if l.open == "" {
			buf.WriteString("[" + name + "] ")
			l.open = name
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			buf.Write(b)
			break
		}
		buf.Write(b[:i+1])
		b = b[i+1:]
		l.open = ""
	}
	_, err := l.Writer.Write(buf.Bytes())
	return err
}

// endsOpen says whether the file at path ends in the middle of a line (a
// log continued after a restart).
func endsOpen(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return false
	}
	last := make([]byte, 1)
	_, err = f.ReadAt(last, fi.Size()-1)
	return err == nil && last[0] != '\n'
}

// readPos reads a .pos file; a missing or damaged one counts nothing.
func readPos(path string) [2]uint64 {
	var p [2]uint64
	if b, err := os.ReadFile(path); err == nil {
		_, _ = fmt.Sscanf(string(b), "%d %d", &p[0], &p[1])
	}
	return p
}

// writePos records the counts. The log is written first: a crash in
// between logs a chunk twice, never loses one.
func (l *runLog) writePos() {
	_ = os.WriteFile(l.posPath, fmt.Appendf(nil, "%d %d\n", l.pos[0], l.pos[1]), 0o600)
}

// resumeAt says where the output that follows begins in each stream (the
// agent's replay after a restart): what the log has from before stays,
// and a gap the agent could not fill is marked.
func (l *runLog) resumeAt(from runtime.StreamOffsets) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, off := range [2]uint64{from.Stdout, from.Stderr} {
		l.cur[i] = off
		if off > l.pos[i] {
			_ = l.writeTagged("sandboxd", fmt.Appendf(nil, "%d bytes of %s were produced while sandboxd was down and are lost\n", off-l.pos[i], streamNames[i]))
			l.pos[i] = off
		}
	}
	l.writePos()
}

// output is the writer for one of the command's streams.
func (l *runLog) output(stream int) io.Writer { return streamWriter{l, stream} }

type streamWriter struct {
	l      *runLog
	stream int
}

func (w streamWriter) Write(b []byte) (int, error) {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	start := l.cur[w.stream]
	l.cur[w.stream] += uint64(len(b))
	// Only what the log does not have yet.
	if skip := l.pos[w.stream] - min(start, l.pos[w.stream]); skip > 0 {
		if skip >= uint64(len(b)) {
			return len(b), nil
		}
		b = b[skip:]
	}
	if l.buf = l.strip[w.stream].Append(l.buf[:0], b); len(l.buf) > 0 {
		if err := l.writeTagged(streamNames[w.stream], l.buf); err != nil {
			return 0, err
		}
	}
	l.pos[w.stream] += uint64(len(b))
	l.writePos()
	return int(l.cur[w.stream] - start), nil
}

// stream is a writer for sandboxd's own words on a stream (not counted as
// the command's output).
func (l *runLog) stream(name string) io.Writer { return prefixWriter{l, name} }

// prefixWriter writes to the run log, each line tagged with its stream.
type prefixWriter struct {
	l    *runLog
	name string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	if err := p.l.writeTagged(p.name, b); err != nil {
		return 0, err
	}
	return len(b), nil
}
