package runs

import (
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/sandboxd/sandboxd/internal/caplog"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The command's output streams, indexes into runLog's counts.
const (
	streamStdout = iota
	streamStderr
)

var streamNames = [2]string{"stdout", "stderr"}

// runLog is a run's log file: each chunk tagged with its stream, capped
// to its head and tail. Next to it (.pos) it keeps how many bytes of each
// of the command's streams it has, so that a server that restarted and
// follows the command again (Reconcile) logs only what it did not have,
// and says so when the agent no longer had some of it.
type runLog struct {
	*caplog.Writer
	posPath string

	mu  sync.Mutex
	pos [2]uint64 // bytes of each stream in the log
	cur [2]uint64 // offset of the next byte the command's stream delivers
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
			fmt.Fprintf(l.Writer, "[sandboxd] %d bytes of %s were produced while sandboxd was down and are lost\n", off-l.pos[i], streamNames[i])
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
	if _, err := fmt.Fprintf(l.Writer, "[%s] %s", streamNames[w.stream], b); err != nil {
		return 0, err
	}
	l.pos[w.stream] += uint64(len(b))
	l.writePos()
	return int(l.cur[w.stream] - start), nil
}

// stream is a writer for sandboxd's own words on a stream (not counted as
// the command's output).
func (l *runLog) stream(name string) io.Writer { return prefixWriter{l, name} }

// prefixWriter writes each chunk to the run log tagged with its stream.
type prefixWriter struct {
	l    *runLog
	name string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	if _, err := fmt.Fprintf(p.l.Writer, "[%s] %s", p.name, b); err != nil {
		return 0, err
	}
	return len(b), nil
}
