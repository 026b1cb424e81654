package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TemplateLogEnd is the data of the "end" event that closes a template's
// build log stream: the build's status once it ended, and why it failed.
type TemplateLogEnd struct {
	Status        string `json:"status"`
	FailureReason string `json:"failureReason,omitempty"`
}

// templateLogPoll is how often a followed build's row is read: its log
// lives in the database (any node of a cluster appends to it), so the
// stream polls it rather than a local file.
const templateLogPoll = 500 * time.Millisecond

// templateLogAnchor bounds the tail of the text sent so far that is looked
// for in the next read of the log, which the store keeps as its last
// store.MaxTemplateLog bytes (cut at a line's start): new text is what
// follows the tail, wherever the log's front was cut to.
const templateLogAnchor = 4 << 10

// templateLog streams a template's build log as Server-Sent Events: "log"
// events {"data"} carry the log as it grows, then one "end" event
// {"status", "failureReason"} once the build is ready or failed (at once
// for an ended build). Another account's template is 404, as for GET.
func (s *Server) templateLog(w http.ResponseWriter, r *http.Request) error {
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	p, id := caller(r).Principal, chi.URLParam(r, "id")
	t, err := s.opts.Templates.Get(r.Context(), p, id)
	if err != nil {
		return err
	}
	sse := startSSE(w)
	sent, idle := "", time.Now()
	tick := time.NewTicker(templateLogPoll)
	defer tick.Stop()
	for {
		if more, dropped := newLogText(sent, t.Log); more != "" || dropped {
			if dropped {
				more = "[sandboxd: the log grew past what the server keeps while it was followed; some lines are not shown here]\n" + more
			}
			if sse.event("log", contract.ExecOutput{Data: more}) != nil {
				return nil // the client went away
			}
			sent, idle = t.Log, time.Now()
		}
		if t.Status != store.TemplateBuilding {
			_ = sse.event("end", TemplateLogEnd{Status: string(t.Status), FailureReason: t.FailureReason})
			return nil
		}
		if time.Since(idle) >= runLogKeepalive {
			if sse.comment("keepalive") != nil {
				return nil
			}
			idle = time.Now()
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-tick.C:
		}
		if t, err = s.opts.Templates.Get(r.Context(), p, id); err != nil {
			if r.Context().Err() == nil {
				s.log.WarnContext(r.Context(), "follow template log", "template_id", id, "err", err, "request_id", edge.RequestID(r.Context()))
				_ = sse.event("error", contract.ExecFailure{Error: "The template's log could not be read (it may have been deleted)", StatusCode: http.StatusNotFound})
			}
			return nil
		}
	}
}

// newLogText is what log holds after the text sent so far, which the
// store may have cut at the front since (it keeps the log's tail); dropped
// says that what was sent is no longer in log at all (more was appended
// between two reads than the store keeps), and more is then all of log.
func newLogText(sent, log string) (more string, dropped bool) {
	if sent == "" {
		return log, false
	}
	anchor := sent[max(0, len(sent)-templateLogAnchor):]
	i := strings.Index(log, anchor)
	if i < 0 {
		return log, true
	}
	return log[i+len(anchor):], false
}
