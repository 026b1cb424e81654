package e2b

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// E2B's sandbox logs (GET /sandboxes/{id}/logs, the `e2b sandbox logs`
// command's route, and GET /v2/sandboxes/{id}/logs). E2B answers them
// with envd's own log; sandboxd's guest agent keeps none a caller could
// use, so a sandbox's log here is its lifecycle, from the events sandboxd
// records (GET /api/events): created, running, paused, resumed, updated,
// snapshot, stopped, failed (level error, with the reason) and a run's
// end. They are in the database, so they are answered on any node, also
// after the sandbox was killed, for --keep-events.

// maxSandboxLogEntries bounds one answer (E2B's default limit for v1).
const maxSandboxLogEntries = 1000

// logEntry is E2B's SandboxLogEntry.
type logEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logLine is E2B's SandboxLog: line is a JSON object with level, logger
// and msg (the e2b CLI parses it), the entry's fields beside them.
type logLine struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// logLevels ranks E2B's LogLevel for the v2 route's level filter.
var logLevels = []string{"debug", "info", "warn", "error"}

// entryOf renders event e as a log entry.
func entryOf(e store.Event) logEntry {
	out := logEntry{Timestamp: e.CreatedAt, Level: "info", Fields: map[string]string{"logger": "lifecycle", "event": e.Type}}
	var data map[string]any
	if len(e.Data) > 0 {
		_ = json.Unmarshal(e.Data, &data)
	}
	for k, v := range data {
		if k == "logger" || k == "event" {
			continue
		}
		if s, ok := v.(string); ok {
			out.Fields[k] = s
		} else if b, err := json.Marshal(v); err == nil {
			out.Fields[k] = string(b)
		}
	}
	what, _ := strings.CutPrefix(e.Type, "sandbox.")
	out.Message = strings.ReplaceAll("sandbox "+what, ".", " ")
	if e.Type == store.EventRunFinished {
		out.Message = "run finished"
	}
	if e.Type == store.EventFailed {
		out.Level = "error"
		if reason := out.Fields["reason"]; reason != "" {
			out.Message += ": " + reason
		}
	}
	return out
}

// line renders the entry as the JSON line of E2B's v1 answer.
func (l logEntry) line() string {
	m := make(map[string]string, len(l.Fields)+2)
	for k, v := range l.Fields {
		m[k] = v
	}
	m["level"], m["msg"] = l.Level, l.Message
	b, _ := json.Marshal(m)
	return string(b)
}

// logQuery is what a logs route asks: events from (forward) or up to
// (backward) at, at least of level, with search in the message.
type logQuery struct {
	at       time.Time
	backward bool
	level    string
	search   string
	limit    int
}

// sandboxLogs answers the caller's sandbox's entries for q; 404 for a
// sandbox the caller never had.
func (a *API) sandboxLogs(r *http.Request, c edge.Caller, q logQuery) ([]logEntry, error) {
	if a.opts.Events == nil {
		return nil, edge.Errorf(http.StatusNotFound, "this server keeps no events, which are a sandbox's log here")
	}
	id := envd.SandboxID(chi.URLParam(r, "id"))
	sb, err := a.opts.Store.GetSandbox(r.Context(), id)
	if err != nil || sb.AccountID != c.AccountID {
		return nil, edge.Errorf(http.StatusNotFound, "sandbox %q not found", chi.URLParam(r, "id"))
	}
	f := store.EventFilter{AccountID: c.AccountID, SandboxID: id, Asc: !q.backward, Limit: 200}
	if !q.at.IsZero() {
		if q.backward {
			f.Until = q.at
		} else {
			f.Since = q.at
		}
	}
	if slices.Index(logLevels, q.level) > slices.Index(logLevels, "info") {
		f.Types = []string{store.EventFailed}
	}
	out := []logEntry{}
	for len(out) < q.limit {
		events, err := a.opts.Events.Events(r.Context(), f)
		if err != nil {
			return nil, err
		}
		for _, e := range events {
			if l := entryOf(e); len(out) < q.limit && strings.Contains(l.Message, q.search) {
				out = append(out, l)
			}
		}
		if len(events) < f.Limit {
			break
		}
		f.After = events[len(events)-1].Cursor()
	}
	return out, nil
}

// intParam reads query parameter name as an integer of at least min
// (def when absent).
func intParam(r *http.Request, name string, def, min int64) (int64, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < min {
		return 0, edge.Errorf(http.StatusBadRequest, "%s must be an integer of at least %d", name, min)
	}
	return n, nil
}

// limitParam reads limit: 1 to maxSandboxLogEntries, maxSandboxLogEntries by default.
func limitParam(r *http.Request) (int, error) {
	n, err := intParam(r, "limit", maxSandboxLogEntries, 0)
	if err != nil {
		return 0, err
	}
	return int(min(max(n, 1), maxSandboxLogEntries)), nil
}

// logs is GET /sandboxes/{id}/logs: entries from start (milliseconds),
// oldest first, as lines and as entries.
func (a *API) logs(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	start, err := intParam(r, "start", 0, 0)
	if err != nil {
		return err
	}
	q := logQuery{level: "debug"}
	if q.limit, err = limitParam(r); err != nil {
		return err
	}
	if start > 0 {
		q.at = time.UnixMilli(start)
	}
	entries, err := a.sandboxLogs(r, c, q)
	if err != nil {
		return err
	}
	lines := make([]logLine, len(entries))
	for i, l := range entries {
		lines[i] = logLine{Timestamp: l.Timestamp, Line: l.line()}
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": lines, "logEntries": entries})
	return nil
}

// logsV2 is GET /v2/sandboxes/{id}/logs: cursor (milliseconds), direction
// forward (oldest first, from cursor) or backward (newest first, up to
// cursor), level (the least to keep), search (in the message).
func (a *API) logsV2(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	cursor, err := intParam(r, "cursor", 0, 0)
	if err != nil {
		return err
	}
	q := logQuery{level: "debug", search: r.URL.Query().Get("search")}
	if q.limit, err = limitParam(r); err != nil {
		return err
	}
	if cursor > 0 {
		q.at = time.UnixMilli(cursor)
	}
	switch d := r.URL.Query().Get("direction"); d {
	case "", "forward":
	case "backward":
		q.backward = true
	default:
		return edge.Errorf(http.StatusBadRequest, "direction must be forward or backward, not %q", d)
	}
	if l := r.URL.Query().Get("level"); l != "" {
		if !slices.Contains(logLevels, l) {
			return edge.Errorf(http.StatusBadRequest, "level must be one of %s, not %q", strings.Join(logLevels, ", "), l)
		}
		q.level = l
	}
	entries, err := a.sandboxLogs(r, c, q)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": entries})
	return nil
}
