package webhooks

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// E2B's lifecycle events (its events API and webhooks): sandboxd's events
// that E2B has a type for, in E2B's shape.

// e2bTypeOf maps sandboxd's event types to E2B's; the others (running, a
// run's end) have none.
var e2bTypeOf = map[string]string{
	store.EventCreated:  "sandbox.lifecycle.created",
	store.EventStopped:  "sandbox.lifecycle.killed",
	store.EventFailed:   "sandbox.lifecycle.killed",
	store.EventPaused:   "sandbox.lifecycle.paused",
	store.EventResumed:  "sandbox.lifecycle.resumed",
	store.EventUpdated:  "sandbox.lifecycle.updated",
	store.EventSnapshot: "sandbox.lifecycle.checkpointed",
}

// E2BType is E2B's name of sandboxd's event type ("" for none).
func E2BType(t string) string { return e2bTypeOf[t] }

// e2bTypes are sandboxd's types E2B has a name for, in the store's order.
func e2bTypes() []string {
	var out []string
	for _, t := range store.EventTypes {
		if e2bTypeOf[t] != "" {
			out = append(out, t)
		}
	}
	return out
}

// E2BTypes are sandboxd's event types that E2B has a name for.
func E2BTypes() []string { return e2bTypes() }

// e2bTypeNames are E2B's type names, each once.
func e2bTypeNames() []string {
	var out []string
	for _, t := range e2bTypes() {
		if n := e2bTypeOf[t]; len(out) == 0 || out[len(out)-1] != n {
			out = append(out, n)
		}
	}
	return out
}

// fromE2BType is sandboxd's types of E2B's type name (nil for none).
func fromE2BType(name string) []string {
	var out []string
	for _, t := range e2bTypes() {
		if e2bTypeOf[t] == name {
			out = append(out, t)
		}
	}
	return out
}

// FromE2BTypes maps E2B's type names to sandboxd's; ok is false for a
// name E2B does not have.
func FromE2BTypes(names []string) (types []string, ok bool) {
	for _, n := range names {
		m := fromE2BType(n)
		if m == nil {
			return nil, false
		}
		types = append(types, m...)
	}
	return types, true
}

// E2BEvent is an event in E2B's shape (its events API and its webhooks'
// payload).
type E2BEvent struct {
	Version            string         `json:"version"`
	ID                 string         `json:"id"`
	Type               string         `json:"type"`
	EventData          map[string]any `json:"eventData"`
	SandboxBuildID     string         `json:"sandboxBuildId"`
	SandboxExecutionID string         `json:"sandboxExecutionId"`
	SandboxID          string         `json:"sandboxId"`
	SandboxTeamID      string         `json:"sandboxTeamId"`
	SandboxTemplateID  string         `json:"sandboxTemplateId"`
	Timestamp          time.Time      `json:"timestamp"`
}

// ToE2B renders ev in E2B's shape, with the sandbox's E2B record (its
// template and metadata; zero for a sandbox the E2B API did not create).
// The sandbox id is E2B's form (envd.E2BID: "sbx_" becomes "sbx-").
func ToE2B(ev store.Event, rec store.E2BSandbox) E2BEvent {
	out := E2BEvent{Version: "v1", ID: ev.ID, Type: e2bTypeOf[ev.Type], SandboxExecutionID: ev.SandboxID,
		SandboxID: e2bID(ev.SandboxID), SandboxTeamID: ev.AccountID, SandboxTemplateID: rec.TemplateID, Timestamp: ev.CreatedAt}
	if out.SandboxTemplateID == "" {
		out.SandboxTemplateID = "base"
	}
	out.SandboxBuildID = out.SandboxTemplateID
	var data map[string]any
	if len(ev.Data) > 0 {
		_ = json.Unmarshal(ev.Data, &data)
	}
	if ev.Type == store.EventUpdated && data != nil {
		// E2B names a timeout's change set_timeout.
		if v, ok := data["timeout_at"]; ok {
			data = map[string]any{"set_timeout": v}
		}
	}
	if len(rec.Metadata) > 0 {
		if data == nil {
			data = map[string]any{}
		}
		data["sandbox_metadata"] = rec.Metadata
	}
	out.EventData = data
	return out
}

// e2bID is a sandbox id in E2B's form (envd.E2BID).
func e2bID(id string) string {
	if rest, ok := strings.CutPrefix(id, "sbx_"); ok {
		return "sbx-" + rest
	}
	return id
}

// e2bEvent renders ev for an E2B webhook, with its sandbox's E2B record.
func (s *Service) e2bEvent(ctx context.Context, ev store.Event) E2BEvent {
	rec, _ := s.st.GetE2BSandbox(ctx, ev.SandboxID)
	return ToE2B(ev, rec)
}
