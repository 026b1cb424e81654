package mcpserver

import (
	"context"
	"reflect"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// The accounts' named persistent volumes (internal/volumes): create_volume,
// list_volumes, resize_volume, fork_volume and delete_volume, as the REST
// API's /api/volumes routes (their arguments checked and their answers
// shown as those routes do: internal/contract); run_command's and
// prompt_sandbox's volumes mount them into a new sandbox. A volume is a
// row of the store every node shares, so every node answers these tools
// itself.

// VolumeService keeps the accounts' volumes (volumes.Service), as the REST
// API's volume routes use it: each method acts on an account the caller
// resolved, and finds a volume by its name or id.
type VolumeService interface {
	Create(ctx context.Context, account, name string, size int64) (volumes.Info, error)
	List(ctx context.Context, account string) ([]volumes.Info, error)
	Delete(ctx context.Context, account, ref string) (volumes.Info, error)
	Resize(ctx context.Context, account, ref string, size int64) (volumes.Info, error)
	Fork(ctx context.Context, account, ref, name string) (volumes.Info, error)
}

type createVolumeArgs struct {
	Name      string `json:"name" jsonschema:"The volume's name, unique in the account: 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit (not vol_)"`
	SizeMB    int64  `json:"size_mb,omitempty" jsonschema:"Its size in MiB (at least 64; default 1024); it can grow later (resize_volume), never shrink"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type listVolumesArgs struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type deleteVolumeArgs struct {
	Name      string `json:"name" jsonschema:"The volume: its name or id (vol_...)"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type resizeVolumeArgs struct {
	Name      string `json:"name" jsonschema:"The volume: its name or id (vol_...)"`
	SizeMB    int64  `json:"size_mb" jsonschema:"Its new size in MiB: not less than it is now"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type forkVolumeArgs struct {
	Name      string `json:"name" jsonschema:"The volume to copy: its name or id (vol_...)"`
	NewName   string `json:"new_name" jsonschema:"The new volume's name, unique in the account (as create_volume's name)"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

// volumeMountArg is one of a new sandbox's volumes (run_command's and
// prompt_sandbox's volumes), as POST /api/sandboxes' volumes.
type volumeMountArg struct {
	Name     string `json:"name" jsonschema:"The volume: its name or id (vol_...; create_volume)"`
	Path     string `json:"path" jsonschema:"Where it is mounted in the sandbox: an absolute path outside /workspace and the system's directories, e.g. /data"`
	ReadOnly bool   `json:"read_only,omitempty" jsonschema:"Mount it read-only (default false). A volume has one read-write sandbox at a time, or any number of read-only ones"`
}

func (h *Handler) volumeTools() []tool {
	return []tool{
		{name: "create_volume", title: "Create a volume", changes: true, in: reflect.TypeFor[createVolumeArgs](), fn: h.createVolume,
			description: "Create a named persistent volume of the account (as POST /api/volumes): an ext4 disk that outlives every sandbox, mounted into new sandboxes with run_command's or prompt_sandbox's volumes. Its data is kept until delete_volume."},
		{name: "list_volumes", title: "List volumes", in: reflect.TypeFor[listVolumesArgs](), fn: h.listVolumes,
			description: "List the account's volumes by name (as GET /api/volumes): id, name, size_mb, and the sandboxes each is attached to (sandbox_id, path, read_only)."},
		{name: "delete_volume", title: "Delete a volume", changes: true, in: reflect.TypeFor[deleteVolumeArgs](), fn: h.deleteVolume,
			description: "Delete one of the account's volumes and its data, by name or id (as DELETE /api/volumes/{name}). Refused (409) while a sandbox has it attached: stop that sandbox first."},
		{name: "resize_volume", title: "Resize a volume", changes: true, in: reflect.TypeFor[resizeVolumeArgs](), fn: h.resizeVolume,
			description: "Grow one of the account's volumes to size_mb MiB (as PATCH /api/volumes/{name}); a volume never shrinks. Refused (409) while a sandbox has it attached; its file system grows at its next attach."},
		{name: "fork_volume", title: "Fork a volume", changes: true, in: reflect.TypeFor[forkVolumeArgs](), fn: h.forkVolume,
			description: "Copy one of the account's volumes, its data as it is now, into a new volume new_name (as POST /api/volumes/{name}/fork). Refused (409) while a sandbox has it read-write, or while its newest data is on another node of a cluster."},
	}
}

func volumeAnswer(v volumes.Info, err error) (*mcp.CallToolResult, error) {
	if err != nil {
		return nil, err
	}
	return jsonResult(contract.VolumeResponse{Status: "success", Volume: contract.VolumeView(v)})
}

func (h *Handler) createVolume(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	req, err := contract.ParseCreateVolume(c.args)
	if err != nil {
		return nil, err
	}
	account, err := h.resolve(ctx, c.who, req.AccountID)
	if err != nil {
		return nil, err
	}
	return volumeAnswer(h.opts.Volumes.Create(ctx, account, req.Name, req.SizeBytes()))
}

func (h *Handler) listVolumes(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	list, err := h.opts.Volumes.List(ctx, account)
	if err != nil {
		return nil, err
	}
	res := contract.VolumesResponse{Status: "success", Volumes: make([]contract.Volume, 0, len(list))}
	for _, v := range list {
		res.Volumes = append(res.Volumes, contract.VolumeView(v))
	}
	return jsonResult(res)
}

func (h *Handler) deleteVolume(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	ref, err := requiredString(c.args, "name")
	if err != nil {
		return nil, err
	}
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	return volumeAnswer(h.opts.Volumes.Delete(ctx, account, ref))
}

func (h *Handler) resizeVolume(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	ref, err := requiredString(c.args, "name")
	if err != nil {
		return nil, err
	}
	req, err := contract.ParseResizeVolume(c.args)
	if err != nil {
		return nil, err
	}
	account, err := h.resolve(ctx, c.who, req.AccountID)
	if err != nil {
		return nil, err
	}
	return volumeAnswer(h.opts.Volumes.Resize(ctx, account, ref, req.SizeBytes()))
}

func (h *Handler) forkVolume(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	ref, err := requiredString(c.args, "name")
	if err != nil {
		return nil, err
	}
	name, err := requiredString(c.args, "new_name")
	if err != nil {
		return nil, err
	}
	account, err := h.account(ctx, c)
	if err != nil {
		return nil, err
	}
	return volumeAnswer(h.opts.Volumes.Fork(ctx, account, ref, name))
}
