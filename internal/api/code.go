package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
)

// codeTarget is the way to the code interpreter of the sandbox the
// request names, once the caller may act on it.
func (s *Server) codeTarget(r *http.Request, requested string) (codeint.Target, error) {
	sb, err := s.sandboxFor(r, requested)
	if err != nil {
		return codeint.Target{}, err
	}
	if s.opts.Sandboxes == nil {
		return codeint.Target{}, errNotAvailable
	}
	t, err := s.opts.Sandboxes.CodeTarget(r.Context(), principal(r), sb.ID)
	if err != nil {
		return t, edge.Explained(err, "Sandbox not found")
	}
	return t, nil
}

// codeTargetOfQuery is codeTarget for the routes whose account_id is in
// the query.
func (s *Server) codeTargetOfQuery(r *http.Request) (codeint.Target, error) {
	requested, err := contract.QueryAccountID(r.URL.Query())
	if err != nil {
		return codeint.Target{}, err
	}
	return s.codeTarget(r, requested)
}

// runCode runs code in a context of a sandbox's code interpreter and
// answers the whole execution as JSON, or streams it: Server-Sent Events
// with Accept: text/event-stream (an event per output line, named by its
// type, then "end", or "failed" when the stream broke), E2B's newline-delimited JSON with Accept:
// application/x-ndjson.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request) error {
	req, err := readBody(w, r, contract.ParseCode)
	if err != nil {
		return err
	}
	t, err := s.codeTarget(r, req.AccountID)
	if err != nil {
		return err
	}
	ereq := req.Interpreter()
	start := time.Now()
	accept := r.Header.Get("Accept")
	switch {
	case strings.Contains(accept, "text/event-stream"):
		var sse *sseWriter
		err = t.Execute(r.Context(), ereq, func(kind string, raw []byte) error {
			if sse == nil {
				sse = startSSE(w)
			}
			switch kind {
			case codeint.LineKeepalive:
				return sse.comment("keepalive")
			case codeint.LineEnd:
				return sse.event("end", codeEnd{DurationMs: time.Since(start).Milliseconds()})
			}
			return sse.event(kind, json.RawMessage(raw))
		})
		if err != nil && sse != nil {
			// Not "error": that is the code's exception.
			_ = sse.event("failed", contract.ExecFailure{Error: err.Error(), StatusCode: http.StatusBadGateway})
			return nil
		}
	case strings.Contains(accept, "application/x-ndjson"):
		started := false
		rc := http.NewResponseController(w)
		err = t.Execute(r.Context(), ereq, func(kind string, raw []byte) error {
			if !started {
				started = true
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.WriteHeader(http.StatusOK)
			}
			if _, err := w.Write(append(raw, '\n')); err != nil {
				return err
			}
			return rc.Flush()
		})
		if started {
			return nil
		}
	default:
		var c codeint.Collector
		if err = t.Execute(r.Context(), ereq, c.Add); err == nil {
			writeJSON(w, http.StatusOK, contract.CodeResponseOf(c.X, time.Since(start)))
		}
	}
	if err != nil {
		return edge.Explained(err, "Code context not found")
	}
	return nil
}

// codeEnd is the data of the last event of a streamed execution.
type codeEnd struct {
	DurationMs int64 `json:"durationMs"`
}

func (s *Server) codeContexts(w http.ResponseWriter, r *http.Request) error {
	t, err := s.codeTargetOfQuery(r)
	if err != nil {
		return err
	}
	cs, err := t.ListContexts(r.Context())
	if err != nil {
		return edge.Explained(err, "Sandbox not found")
	}
	resp := contract.CodeContextsResponse{Status: "success", Contexts: make([]contract.CodeContext, 0, len(cs))}
	for _, c := range cs {
		resp.Contexts = append(resp.Contexts, contract.CodeContext{ID: c.ID, Language: c.Language, Cwd: c.Cwd})
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

func (s *Server) createCodeContext(w http.ResponseWriter, r *http.Request) error {
	req, err := readBody(w, r, contract.ParseCodeContext)
	if err != nil {
		return err
	}
	t, err := s.codeTarget(r, req.AccountID)
	if err != nil {
		return err
	}
	c, err := t.CreateContext(r.Context(), req.Language, req.Cwd)
	if err != nil {
		return edge.Explained(err, "Sandbox not found")
	}
	writeJSON(w, http.StatusOK, contract.CodeContextResponse{Status: "success", Context: contract.CodeContext{ID: c.ID, Language: c.Language, Cwd: c.Cwd}})
	return nil
}

func (s *Server) restartCodeContext(w http.ResponseWriter, r *http.Request) error {
	return s.onCodeContext(w, r, codeint.Target.RestartContext)
}

func (s *Server) removeCodeContext(w http.ResponseWriter, r *http.Request) error {
	return s.onCodeContext(w, r, codeint.Target.RemoveContext)
}

func (s *Server) onCodeContext(w http.ResponseWriter, r *http.Request, op func(codeint.Target, context.Context, string) error) error {
	t, err := s.codeTargetOfQuery(r)
	if err != nil {
		return err
	}
	if err := op(t, r.Context(), chi.URLParam(r, "contextId")); err != nil {
		return edge.Explained(err, "Code context not found")
	}
	writeJSON(w, http.StatusOK, contract.StatusResponse{Status: "success"})
	return nil
}
