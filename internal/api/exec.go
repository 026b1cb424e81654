package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/capbuf"
	"github.com/sandboxd/sandboxd/internal/store"
)

// maxExecOutput bounds what a non-streamed exec keeps of each stream; the
// streamed form has no bound.
const maxExecOutput = 1 << 20

func (s *Server) execSandbox(w http.ResponseWriter, r *http.Request) error {
	req, err := readBody(w, r, parseExec)
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
	stdout, stderr := capbuf.New(maxExecOutput), capbuf.New(maxExecOutput)
	res, err := s.opts.Sandboxes.Exec(r.Context(), principal(r), sb.ID, req.Domain(), stdout, stderr)
	if err != nil {
		if s.callerGone(r, sb, req) {
			return nil
		}
		return serviceError(err, "Sandbox not found")
	}
	writeJSON(w, http.StatusOK, ExecResponse{
		Status: "success", ExitCode: res.ExitCode, OOMKilled: res.OOMKilled, TimedOut: res.TimedOut,
		Stdout: stdout.String("not shown; stream the exec to see all"), Stderr: stderr.String("not shown; stream the exec to see all"),
		DurationMs: time.Since(start).Milliseconds(),
	})
	return nil
}

// execStream sends the command's output as Server-Sent Events: "stdout" and
// "stderr" events carry {"data": "..."}, a final "exit" event carries
// {"exitCode": N, "durationMs": N}, or "error" carries {"error": "..."}.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, sb store.Sandbox, req ExecRequest, start time.Time) {
	sse := startSSE(w)
	drop := !req.KillOnDisconnect
	res, err := s.opts.Sandboxes.Exec(r.Context(), principal(r), sb.ID, req.Domain(), streamTo{sse, "stdout", drop}, streamTo{sse, "stderr", drop})
	if err != nil {
		if s.callerGone(r, sb, req) {
			return
		}
		var e *Error
		failure := ExecFailure{Error: "Internal server error", StatusCode: http.StatusInternalServerError}
		if errors.As(serviceError(err, "Sandbox not found"), &e) {
			failure = ExecFailure{Error: e.Msg, StatusCode: e.Status}
		} else {
			s.log.ErrorContext(r.Context(), "exec", "err", err, "sandbox_id", sb.ID, "request_id", requestID(r.Context()))
		}
		_ = sse.event("error", failure)
		return
	}
	_ = sse.event("exit", ExecExit{ExitCode: res.ExitCode, OOMKilled: res.OOMKilled, TimedOut: res.TimedOut, DurationMs: time.Since(start).Milliseconds()})
}

// callerGone reports, for an exec that failed, whether its client went
// away before the command ended, and logs what became of the command:
// there is nobody to answer.
func (s *Server) callerGone(r *http.Request, sb store.Sandbox, req ExecRequest) bool {
	ctx := r.Context()
	if ctx.Err() == nil {
		return false
	}
	fate := "runs on"
	if req.KillOnDisconnect {
		fate = "was killed (killOnDisconnect)"
	}
	s.log.InfoContext(ctx, "exec: the client went away; the command "+fate,
		"sandbox_id", sb.ID, "command", req.Command, "request_id", requestID(ctx))
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
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *sseWriter) event(name string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", name, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", name, data); err != nil {
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
type streamTo struct {
	sse  *sseWriter
	name string
	drop bool
}

func (s streamTo) Write(p []byte) (int, error) {
	if err := s.sse.event(s.name, ExecOutput{Data: string(p)}); err != nil && !s.drop {
		return 0, err
	}
	return len(p), nil
}
