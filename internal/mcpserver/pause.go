package mcpserver

import (
	"context"
	"net/http"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// pause_sandbox and resume_sandbox: a sandbox's pause (with its memory, or
// its files alone) and resume, as POST /api/sandboxes/{id}/pause and
// /resume, done on the node that hosts it.

type pauseArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The running sandbox to pause"`
	Memory    *bool  `json:"memory,omitempty" jsonschema:"true (the default): keep its memory and processes on its node; false: keep its files alone in the blob store, and a resume on any node starts its processes afresh"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type resumeArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The paused sandbox to resume"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

// PauseService pauses and resumes sandboxes (package sandbox's Manager);
// a SandboxService without it answers that this server cannot.
type PauseService interface {
	Pause(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	PauseFiles(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	Resume(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
}

func (h *Handler) pauseTools() []tool {
	return []tool{
		{name: "pause_sandbox", title: "Pause a sandbox", changes: true, in: reflect.TypeFor[pauseArgs](), fn: h.pauseSandbox,
			description: "Pause a running sandbox (as POST /api/sandboxes/{id}/pause): with its memory and processes kept on its node (the default), or with its files alone (memory false: kept in the blob store; the resume starts its processes afresh, on any node). Its timeout stops while it is paused; any use, or resume_sandbox, resumes it."},
		{name: "resume_sandbox", title: "Resume a sandbox", changes: true, in: reflect.TypeFor[resumeArgs](), fn: h.resumeSandbox,
			description: "Resume a paused sandbox (as POST /api/sandboxes/{id}/resume): where it was, or, paused with its files alone, started again from them."},
	}
}

func (h *Handler) pauseSandbox(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	req, err := contract.ParsePause(c.args)
	if err != nil {
		return nil, err
	}
	files := req.Memory != nil && !*req.Memory
	svc, err := h.pauser()
	if err != nil {
		return nil, err
	}
	return h.actOnSandbox(ctx, c, "pause", req, func(p auth.Principal, id string) (store.Sandbox, error) {
		if files {
			return svc.PauseFiles(ctx, p, id)
		}
		return svc.Pause(ctx, p, id)
	})
}

func (h *Handler) resumeSandbox(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	requested, err := c.args.AccountID()
	if err != nil {
		return nil, err
	}
	svc, err := h.pauser()
	if err != nil {
		return nil, err
	}
	return h.actOnSandbox(ctx, c, "resume", contract.AccountRequest{AccountID: requested}, func(p auth.Principal, id string) (store.Sandbox, error) {
		return svc.Resume(ctx, p, id)
	})
}

// pauser is the server's PauseService, or a clear refusal.
func (h *Handler) pauser() (PauseService, error) {
	svc, ok := h.opts.Sandboxes.(PauseService)
	if !ok {
		return nil, errdefs.New(errdefs.ErrInvalid, "this server cannot pause sandboxes")
	}
	return svc, nil
}

// actOnSandbox does verb (stop, pause, resume) to the call's sandbox: on
// the node that hosts it through its REST route (body is the route's),
// else here with do; it answers the sandbox as it is then.
func (h *Handler) actOnSandbox(ctx context.Context, c *call, verb string, body any, do func(auth.Principal, string) (store.Sandbox, error)) (*mcp.CallToolResult, error) {
	id, err := requiredString(c.args, "sandbox_id")
	if err != nil {
		return nil, err
	}
	requested, err := c.args.AccountID()
	if err != nil {
		return nil, err
	}
	sb, err := h.sandbox(ctx, c.who, requested, id)
	if err != nil {
		return nil, err
	}
	if node, ok := h.opts.Gate.Elsewhere(ctx, c.who, sb.ID); ok {
		var resp contract.SandboxResponse
		if err := h.callNode(ctx, node, c.who, false, http.MethodPost, sandboxPath(sb.ID, verb), body, &resp); err != nil {
			return nil, err
		}
		return jsonResult(resp)
	}
	sb, err = do(c.who.Principal, sb.ID)
	if err != nil {
		return nil, edge.Explained(err, "Sandbox not found")
	}
	return jsonResult(contract.SandboxResponse{Status: "success", Sandbox: contract.ViewSandbox(sb, h.opts.Now())})
}
