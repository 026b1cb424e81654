package mcpserver

import (
	"context"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// EventService lists an account's lifecycle events (internal/webhooks).
type EventService interface {
	Events(ctx context.Context, f store.EventFilter) ([]store.Event, error)
}

type listEventsArgs struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"Only this sandbox's events"`
	Type      string `json:"type,omitempty" jsonschema:"Only events of these types, comma-separated (sandbox.created, sandbox.running, sandbox.paused, sandbox.resumed, sandbox.updated, sandbox.snapshot, run.finished, sandbox.stopped, sandbox.failed)"`
	Limit     int    `json:"limit,omitempty" jsonschema:"How many, newest first (1 to 100, default 20)"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

func (h *Handler) eventTools() []tool {
	return []tool{{name: "list_events", title: "List lifecycle events", in: reflect.TypeFor[listEventsArgs](), fn: h.listEvents,
		description: "List the account's lifecycle events, newest first (as GET /api/events): each sandbox's creation, start, pauses and resumes, new timeouts, named snapshots, runs' ends, and its stop or failure with the reason."}}
}

func (h *Handler) listEvents(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	f := store.EventFilter{AccountID: account, Limit: 20}
	if f.SandboxID, _, err = c.args.String("sandbox_id"); err != nil {
		return nil, err
	}
	types, _, err := c.args.String("type")
	if err != nil {
		return nil, err
	}
	var bad *edge.Error
	if f.Types, bad = contract.ParseEventTypes(types); bad != nil {
		bad.Fields = []any{"type"} // the tool's argument
		return nil, bad
	}
	if n, ok, err := c.args.Int("limit"); err != nil {
		return nil, err
	} else if ok {
		if n < 1 || n > 100 {
			return nil, contract.FieldError("limit must be 1 to 100", "limit")
		}
		f.Limit = int(n)
	}
	events, err := h.opts.Events.Events(ctx, f)
	if err != nil {
		return nil, err
	}
	resp := contract.EventsResponse{Status: "success", Events: make([]contract.Event, 0, len(events))}
	for _, e := range events {
		resp.Events = append(resp.Events, contract.EventView(e))
	}
	return jsonResult(resp)
}
