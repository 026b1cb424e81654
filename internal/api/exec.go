package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/capbuf"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

func (s *Server) execSandbox(w http.ResponseWriter, r *http.Request) error {
	req, err := readBody(w, r, contract.ParseExec)
	if err != nil {
		return err
	}
	sb, err := s.sandboxFor(r, req.AccountID)
	if err != nil {
		return err
	}
	if s.opts.Sandboxes == nil {
		return errNotAvailable
	}
	start := time.Now()
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		s.execStream(w, r, sb, req, start)
		return nil
	}
	stdout, stderr := capbuf.New(contract.MaxExecOutput), capbuf.New(contract.MaxExecOutput)
	res, err := s.opts.Sandboxes.Exec(r.Context(), principal(r), sb.ID, req.Domain(), stdout, stderr)
	if err != nil {
		if s.callerGone(r, sb, req) {
			return nil
		}
		return edge.Explained(err, "Sandbox not found")
	}
	writeJSON(w, http.StatusOK, contract.ExecResponse{
		Status: "success", ExitCode: res.ExitCode, OOMKilled: res.OOMKilled, TimedOut: res.TimedOut,
		Stdout: stdout.String("not shown; stream the exec to see all"), Stderr: stderr.String("not shown; stream the exec to see all"),
		DurationMs: time.Since(start).Milliseconds(),
	})
	return nil
}

// execStream sends the command's output as Server-Sent Events: "stdout" and
// "stderr" events carry {"data": "..."}, a final "exit" event carries
// {"exitCode": N, "durationMs": N}, or "error" carries {"error": "..."}.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, sb store.Sandbox, req contract.ExecRequest, start time.Time) {
	sse := startSSE(w)
	drop := !req.KillOnDisconnect
	stdout, stderr := &streamTo{sse: sse, name: "stdout", drop: drop}, &streamTo{sse: sse, name: "stderr", drop: drop}
	res, err := s.opts.Sandboxes.Exec(r.Context(), principal(r), sb.ID, req.Domain(), stdout, stderr)
	stdout.end()
	stderr.end()
	if err != nil {
		if s.callerGone(r, sb, req) {
			return
		}
		e, internal := edge.Explain(err, "Sandbox not found")
		if internal {
			s.log.ErrorContext(r.Context(), "exec", "err", err, "sandbox_id", sb.ID, "request_id", edge.RequestID(r.Context()))
		}
		_ = sse.event("error", contract.ExecFailure{Error: e.Msg, StatusCode: e.Status})
		return
	}
	_ = sse.event("exit", contract.ExecExit{ExitCode: res.ExitCode, OOMKilled: res.OOMKilled, TimedOut: res.TimedOut, DurationMs: time.Since(start).Milliseconds()})
}

// callerGone reports, for an exec that failed, whether its client went
// away before the command ended, and logs what became of the command:
// there is nobody to answer.
func (s *Server) callerGone(r *http.Request, sb store.Sandbox, req contract.ExecRequest) bool {
	ctx := r.Context()
	if ctx.Err() == nil {
		return false
	}
	fate := "runs on"
	if req.KillOnDisconnect {
		fate = "was killed (killOnDisconnect)"
	}
	s.log.InfoContext(ctx, "exec: the client went away; the command "+fate,
		"sandbox_id", sb.ID, "command", req.Command, "request_id", edge.RequestID(ctx))
	return true
}

// startSSE answers 200 as a stream of Server-Sent Events, unbuffered by
// proxies on the way, and returns its writer.
func startSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

// sseWriter serialises events from concurrent stdout/stderr writers and
// flushes each one so the client sees output as it happens.
type sseWriter struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf bytes.Buffer  // an event being written; reused, as output events come in bulk
	enc *json.Encoder // writes to buf
}

func (e *sseWriter) event(name string, v any) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.enc == nil {
		e.enc = json.NewEncoder(&e.buf)
	}
	e.buf.Reset()
	e.buf.WriteString("event: " + name + "\ndata: ")
	// Encode ends the JSON with the line's newline; a blank line ends the event.
	if err := e.enc.Encode(v); err != nil {
		return fmt.Errorf("encode %s event: %w", name, err)
	}
	e.buf.WriteByte('\n')
	if _, err := e.w.Write(e.buf.Bytes()); err != nil {
		return err
	}
	return e.rc.Flush()
}

// comment sends an SSE comment (a keepalive that clients ignore).
func (e *sseWriter) comment(text string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := fmt.Fprintf(e.w, ": %s\n\n", text); err != nil {
		return err
	}
	return e.rc.Flush()
}

// streamTo is an io.Writer that turns each write into an event. A write
// that fails (the client is gone) fails the command's output, which kills
// the command, unless drop says to drop what the client can no longer
// receive: a command that survives its caller.
//
// An event's data is a JSON string, so a UTF-8 character that a write
// cuts in two is held back and sent with the next write's start: sent
// apart, each half would turn into U+FFFD. end sends what is held.
type streamTo struct {
	sse  *sseWriter
	name string
	drop bool
	held []byte // the start of a character the last write cut, at most 3 bytes
}

func (s *streamTo) Write(p []byte) (int, error) {
	data := p
	if len(s.held) > 0 {
		data = append(s.held, p...)
	}
	cut := len(data) - partialRune(data)
	s.held = append([]byte(nil), data[cut:]...)
	if err := s.send(data[:cut]); err != nil {
		return 0, err
	}
	return len(p), nil
}

// end sends what the last write held back: a character the output never
// finished, which the event carries as U+FFFD.
func (s *streamTo) end() {
	_ = s.send(s.held)
	s.held = nil
}

func (s *streamTo) send(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	if err := s.sse.event(s.name, contract.ExecOutput{Data: string(data)}); err != nil && !s.drop {
		return err
	}
	return nil
}

// partialRune is how many bytes at the end of b begin a UTF-8 character
// that b does not finish (0 to 3). Bytes that cannot begin one count as
// whole: they are not UTF-8, and no later byte would make them so.
func partialRune(b []byte) int {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		if c := b[len(b)-i]; utf8.RuneStart(c) {
			if c >= utf8.RuneSelf && !utf8.FullRune(b[len(b)-i:]) {
				return i
			}
			return 0
		}
	}
	return 0
}
