package api

import (
	"errors"
	"io"
	"io/fs"
	"net/http"
	"os"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// RunLogService opens the logs of the runs this node executed
// (DATA_DIR/runs, internal/runs).
type RunLogService interface {
	// OpenRunLog opens run id's log as it is being written; an error
	// wrapping fs.ErrNotExist when this node has none (the run has not
	// started, its log was pruned, or it has none: a task's run).
	OpenRunLog(id string) (*os.File, error)
}

// RunLogEnd is the data of the "end" event that closes a run's log stream:
// the run's status once it finished.
type RunLogEnd struct {
	Status string `json:"status"`
}

// How the log stream follows a log: the file is looked at every
// runLogPoll (the log is a plain file any process may be writing), the
// run's status every runLogStatusEvery polls, and an idle stream gets a
// comment every runLogKeepalive so that proxies keep it open.
const (
	runLogPoll        = 250 * time.Millisecond
	runLogStatusEvery = 4
	runLogKeepalive   = 15 * time.Second
	runLogChunk       = 32 << 10
)

// runLog streams a run's log as Server-Sent Events: "log" events carry
// {"data"} (the log's text as it grows: each line tagged "[stdout] " or
// "[stderr] ", as the file holds it), then one "end"
// event {"status"} once the run finished; "error" {"error","statusCode"}
// when the log cannot be read. A run that finished answers its log at once
// and ends.
func (s *Server) runLog(w http.ResponseWriter, r *http.Request) error {
	requested, err := contract.QueryAccountID(r.URL.Query())
	if err != nil {
		return err
	}
	if _, err := s.actFor(r, requested); err != nil {
		return err
	}
	run, err := s.opts.Gate.Run(r.Context(), caller(r), chi.URLParam(r, "id"), requested)
	if err != nil {
		return err
	}
	// A command's run is worked on the node of its sandbox (jobs routes
	// it there), which is where its log is.
	if s.opts.Gate.ForwardIfElsewhere(w, r, caller(r), run.SandboxID) {
		return nil
	}
	if s.opts.RunLogs == nil {
		return errNotAvailable
	}
	sse := startSSE(w)
	if err := s.followRunLog(r, sse, run); err != nil {
		s.log.WarnContext(r.Context(), "follow run log", "run_id", run.ID, "err", err, "request_id", edge.RequestID(r.Context()))
		_ = sse.event("error", contract.ExecFailure{Error: "The run's log could not be read", StatusCode: http.StatusInternalServerError})
	}
	return nil
}

// followRunLog sends run's log as it grows until the run finished and its
// log was read to the end, or the client went away.
func (s *Server) followRunLog(r *http.Request, sse *sseWriter, run store.Run) error {
	ctx := r.Context()
	var (
		file    *os.File
		off     int64
		pending []byte // the start of a character the next read completes
		buf     = make([]byte, runLogChunk)
		idle    = time.Now() // when the stream last sent something
	)
	defer func() {
		if file != nil {
			file.Close()
		}
	}()
	tick := time.NewTicker(runLogPoll)
	defer tick.Stop()
	for polls := 0; ; polls++ {
		// The status first, the log after: once the run is seen
		// finished, the read that follows has everything it wrote.
		finished := contract.ViewRun(run, s.opts.Now()).IsCompleted
		if !finished && polls%runLogStatusEvery == 0 && polls > 0 {
			latest, err := s.opts.Store.GetRun(ctx, run.ID)
			switch {
			case errors.Is(err, store.ErrNotFound):
				// Its record was pruned: it has long finished.
				finished = true
			case err != nil:
				return err
			default:
				run = latest
				finished = contract.ViewRun(run, s.opts.Now()).IsCompleted
			}
		}
		if file == nil {
			f, err := s.opts.RunLogs.OpenRunLog(run.ID)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			file = f
		}
		if file != nil {
			st, err := file.Stat()
			if err != nil {
				return err
			}
			size := st.Size()
			if size < off {
				// The log passed its cap (--log-max-mib) and its tail was
				// moved down: go on from its end.
				if err := sse.event("log", contract.ExecOutput{Data: "\n[sandboxd: the log passed its cap while it was followed; some output is not shown here]\n"}); err != nil {
					return nil
				}
				off, pending = size, nil
			}
			for off < size {
				n, err := file.ReadAt(buf[:min(int64(len(buf)), size-off)], off)
				if err != nil && !errors.Is(err, io.EOF) {
					return err
				}
				if n == 0 {
					break
				}
				off += int64(n)
				var whole []byte
				whole, pending = splitUTF8(append(pending, buf[:n]...))
				if len(whole) > 0 {
					if err := sse.event("log", contract.ExecOutput{Data: string(whole)}); err != nil {
						return nil // the client went away
					}
					idle = time.Now()
				}
			}
		}
		if finished {
			if len(pending) > 0 {
				_ = sse.event("log", contract.ExecOutput{Data: string(pending)})
			}
			_ = sse.event("end", RunLogEnd{Status: string(run.Status)})
			return nil
		}
		if time.Since(idle) >= runLogKeepalive {
			if err := sse.comment("keepalive"); err != nil {
				return nil
			}
			idle = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// splitUTF8 splits b before a character whose bytes it does not hold
// whole yet, so that no event cuts one in two (JSON would make each half a
// replacement character).
func splitUTF8(b []byte) (whole, rest []byte) {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i], b[i:]
			}
			break
		}
	}
	return b, nil
}
