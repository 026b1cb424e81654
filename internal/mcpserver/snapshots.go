package mcpserver

import (
	"context"
	"net/http"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// SnapshotService keeps the accounts' named snapshots, as the REST API's
// snapshot routes use it (internal/templates; part of TemplateService):
// Snapshot applies the one access rule to the sandbox; the others act on
// an account the caller resolved under it.
type SnapshotService interface {
	Snapshot(ctx context.Context, p auth.Principal, sandboxID, name string) (store.Template, error)
	Snapshots(ctx context.Context, accountID, sandboxID string) ([]store.Template, error)
	DeleteSnapshot(ctx context.Context, accountID, ref string) (store.Template, error)
}

type snapshotSandboxArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The running sandbox whose files to save"`
	Name      string `json:"name,omitempty" jsonschema:"name[:tag] of the snapshot (tag latest by default); a snapshot of that name is replaced; absent: named by its id"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type listSnapshotsArgs struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"Only the snapshots taken of this sandbox"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type deleteSnapshotArgs struct {
	Snapshot  string `json:"snapshot" jsonschema:"The snapshot: its name[:tag] or id"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

func (h *Handler) snapshotTools() []tool {
	return []tool{
		{name: "snapshot_sandbox", title: "Snapshot a sandbox", changes: true, in: reflect.TypeFor[snapshotSandboxArgs](), fn: h.snapshotSandbox,
			description: "Save a running sandbox's files as a named snapshot of its account (as POST /api/sandboxes/{id}/snapshots): run_command's snapshot starts new sandboxes from it, any number of times. Its files only, not its memory or processes. Saving a name again replaces that snapshot. The sandbox runs on."},
		{name: "list_snapshots", title: "List snapshots", in: reflect.TypeFor[listSnapshotsArgs](), fn: h.listSnapshots,
			description: "List the account's named snapshots, newest first (GET /api/snapshots' named): id, name, tag, ref and the sandbox each was taken of."},
		{name: "delete_snapshot", title: "Delete a snapshot", changes: true, in: reflect.TypeFor[deleteSnapshotArgs](), fn: h.deleteSnapshot,
			description: "Delete one of the account's named snapshots by name[:tag] or id (as DELETE /api/snapshots/{name}). Refused while running or paused sandboxes started from it."},
	}
}

func (h *Handler) snapshotSandbox(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	id, err := requiredString(c.args, "sandbox_id")
	if err != nil {
		return nil, err
	}
	req, err := contract.ParseCreateSnapshot(c.args)
	if err != nil {
		return nil, err
	}
	sb, err := h.sandbox(ctx, c.who, req.AccountID, id)
	if err != nil {
		return nil, err
	}
	if node, ok := h.opts.Gate.Elsewhere(ctx, c.who, sb.ID); ok {
		// Its files are captured by the runtime of the node hosting it.
		var resp contract.NamedSnapshotResponse
		if err := h.callNode(ctx, node, c.who, false, http.MethodPost, sandboxPath(sb.ID, "snapshots"), req, &resp); err != nil {
			return nil, err
		}
		return jsonResult(resp)
	}
	t, err := h.opts.Templates.Snapshot(ctx, c.who.Principal, sb.ID, req.Name)
	if err != nil {
		return nil, edge.Explained(err, "Sandbox not found")
	}
	return jsonResult(contract.NamedSnapshotResponse{Status: "success", Snapshot: contract.NamedSnapshotView(t)})
}

// snapshotsResult answers list_snapshots.
type snapshotsResult struct {
	Status    string                   `json:"status"`
	Snapshots []contract.NamedSnapshot `json:"snapshots"`
}

func (h *Handler) listSnapshots(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	sandboxID, _, err := c.args.String("sandbox_id")
	if err != nil {
		return nil, err
	}
	list, err := h.opts.Templates.Snapshots(ctx, account, sandboxID)
	if err != nil {
		return nil, err
	}
	res := snapshotsResult{Status: "success", Snapshots: make([]contract.NamedSnapshot, 0, len(list))}
	for _, t := range list {
		res.Snapshots = append(res.Snapshots, contract.NamedSnapshotView(t))
	}
	return jsonResult(res)
}

func (h *Handler) deleteSnapshot(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	ref, err := requiredString(c.args, "snapshot")
	if err != nil {
		return nil, err
	}
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	t, err := h.opts.Templates.DeleteSnapshot(ctx, account, ref)
	if err != nil {
		return nil, err
	}
	return jsonResult(contract.NamedSnapshotResponse{Status: "success", Snapshot: contract.NamedSnapshotView(t)})
}
