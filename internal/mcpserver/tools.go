package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// call is one tool call: who makes it and its arguments.
type call struct {
	req  *mcp.CallToolRequest
	who  edge.Caller
	args contract.Args
}

// toolFunc does a tool's work. Its error is answered as a tool error with
// what edge.Explain tells of it; an internal one is logged and answered as
// an internal error that leaks nothing.
type toolFunc func(ctx context.Context, c *call) (*mcp.CallToolResult, error)

// tool describes one tool: In documents its arguments (the schema clients
// see); the handler checks them itself, with the API's messages.
type tool struct {
	name, title, description string
	// changes is true for tools that change state or start work: a
	// sandbox's own key may not use them, as it may only GET the API.
	changes bool
	in      reflect.Type
	fn      toolFunc
}

func (h *Handler) addTools(srv *mcp.Server) {
	all := append(append(h.tools(), h.pauseTools()...), h.codeTools()...)
	if h.opts.Templates != nil {
		all = append(all, h.templateTools()...)
		all = append(all, h.snapshotTools()...)
	}
	if h.opts.Events != nil {
		all = append(all, h.eventTools()...)
	}
	if h.opts.Volumes != nil {
		all = append(all, h.volumeTools()...)
	}
	for _, t := range all {
		destructive := t.changes
		srv.AddTool(&mcp.Tool{
			Name: t.name, Title: t.title, Description: t.description, InputSchema: mustInputSchema(t.name, t.in),
			Annotations: &mcp.ToolAnnotations{Title: t.title, ReadOnlyHint: !t.changes, DestructiveHint: &destructive},
		}, h.handle(t))
	}
}

func (h *Handler) handle(t tool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx, cancel := boundToRequest(ctx)
		defer cancel()
		who, ok := caller(ctx)
		if !ok {
			// ServeHTTP authenticates every request; a handler without a
			// caller is a wiring error, refused rather than trusted.
			return errorResult(auth.ErrUnauthorized), nil
		}
		if t.changes {
			if err := who.MayCall(http.MethodPost); err != nil {
				return errorResult(edge.ScopeError("the " + t.name + " tool")), nil
			}
		}
		args, err := contract.DecodeArgs(req.Params.Arguments)
		if err != nil {
			return errorResult(err), nil
		}
		res, err := t.fn(ctx, &call{req: req, who: who, args: args})
		if err != nil {
			if _, internal := edge.Explain(err, ""); internal {
				h.log.ErrorContext(ctx, "mcp tool failed", "tool", t.name, "account_id", who.AccountID, "err", err)
			}
			return errorResult(err), nil
		}
		return res, nil
	}
}

// toolError is the structured content of a tool error: the API's error
// body and its HTTP status.
type toolError struct {
	contract.ErrorBody
	StatusCode int `json:"statusCode"`
}

// errorResult is the isError result of err: what edge.Explain tells of it,
// as the API answers it.
func errorResult(err error) *mcp.CallToolResult {
	e, _ := edge.Explain(err, "")
	body := toolError{ErrorBody: contract.ErrorBody{Status: "error", Error: e.Msg, MissingFields: e.Fields}, StatusCode: e.Status}
	return &mcp.CallToolResult{
		IsError:           true,
		Content:           []mcp.Content{&mcp.TextContent{Text: e.Msg}},
		StructuredContent: body,
	}
}

// jsonResult answers v as structured content and as its JSON text, for
// clients that show only text to the model.
func jsonResult(v any) (*mcp.CallToolResult, error) {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode result: %w", err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(data)}}, StructuredContent: v}, nil
}

// resolve is the account a call acts for: its account_id if the key may
// act for it (the API's one rule), else the key's own.
func (h *Handler) resolve(ctx context.Context, who edge.Caller, requested string) (string, error) {
	return h.opts.Gate.Account(ctx, who, requested)
}

// account resolves the call's optional account_id.
func (h *Handler) account(ctx context.Context, c *call) (string, error) {
	requested, err := c.args.AccountID()
	if err != nil {
		return "", err
	}
	return h.resolve(ctx, c.who, requested)
}

// requiredString is a string argument that must be present and not empty.
func requiredString(a contract.Args, name string) (string, error) {
	s, _, err := a.String(name)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", contract.FieldError(name+" is required", name)
	}
	return s, nil
}

// sandbox loads a sandbox the caller may see, as the API's /{id} routes
// do (edge.Gate.Sandbox).
func (h *Handler) sandbox(ctx context.Context, who edge.Caller, requested, id string) (store.Sandbox, error) {
	return h.opts.Gate.Sandbox(ctx, who, id, requested)
}

// run loads a run the caller may see, as GET /api/tasks/runs?runId= does:
// a bad account_id is refused before the run is looked up.
func (h *Handler) run(ctx context.Context, who edge.Caller, requested, id string) (store.Run, error) {
	if _, err := h.resolve(ctx, who, requested); err != nil {
		return store.Run{}, err
	}
	return h.opts.Gate.Run(ctx, who, id, requested)
}
