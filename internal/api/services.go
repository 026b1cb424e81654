package api

import (
	"context"
	"io"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// Services return errdefs errors; edge.Explain tells them.

// SandboxService creates and drives sandboxes (internal/sandbox).
type SandboxService interface {
	contract.SandboxService
	// Ports lists the TCP ports something listens on in a running sandbox.
	Ports(ctx context.Context, p auth.Principal, id string) ([]int, error)
	// CodeTarget is the way to a running sandbox's code interpreter and
	// who code runs as there (a paused sandbox is resumed).
	CodeTarget(ctx context.Context, p auth.Principal, id string) (codeint.Target, error)
	// Processes lists the processes exec and runs started in a running
	// sandbox that still run.
	Processes(ctx context.Context, p auth.Principal, id string) ([]runtime.Process, error)
	// SignalProcess signals a process of a running sandbox and its tree.
	SignalProcess(ctx context.Context, p auth.Principal, id string, pid int, sig syscall.Signal) error
	// SetTimeout makes the sandbox stop d from now (d from its resume,
	// when it is paused).
	SetTimeout(ctx context.Context, p auth.Principal, id string, d time.Duration) (store.Sandbox, error)
	// Pause saves a running sandbox whole (memory, processes, files) and
	// stops it running and its deadline clock; a paused one is answered
	// as it is.
	Pause(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	PauseFiles(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	// Resume brings a paused sandbox back where it was; a running one is
	// answered as it is.
	Resume(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	// Fork starts count sandboxes from a running sandbox's memory and
	// filesystem, each living lifetime (0: the default).
	Fork(ctx context.Context, p auth.Principal, id string, count int, lifetime time.Duration) ([]store.Sandbox, error)
	// Traffic is what a running sandbox's network carried; nil when it
	// has none (or is not on this node).
	Traffic(ctx context.Context, p auth.Principal, id string) (*netpol.Traffic, error)
	// SetNetwork replaces a running sandbox's network policy.
	SetNetwork(ctx context.Context, p auth.Principal, id string, policy netpol.Policy) (store.Sandbox, error)
	// Delete removes an ended sandbox's row now, as retention would
	// later; a live one, or one an unfinished run names, is refused.
	Delete(ctx context.Context, p auth.Principal, id string) error
	// DeleteEnvironment stops the account's sandboxes, deletes its
	// repository and snapshots and clears its row; idempotent.
	DeleteEnvironment(ctx context.Context, accountID string) (*store.Environment, error)
	// CheckRepoURL refuses (errdefs.ErrInvalid) a repository URL that the account
	// may not name: one on the configured forge that is not its own mirror.
	CheckRepoURL(accountID, url string) error
}

// TemplateService builds and keeps the accounts' templates
// (internal/templates).
type TemplateService interface {
	Build(ctx context.Context, p auth.Principal, req templates.BuildRequest) (store.Template, error)
	List(ctx context.Context, p auth.Principal) ([]store.Template, error)
	Get(ctx context.Context, p auth.Principal, id string) (store.Template, error)
	Delete(ctx context.Context, p auth.Principal, id string) error
	// HasFiles and PutFiles are the account's uploaded build files
	// (archives COPY steps read), named by a SHA-256 in hex.
	HasFiles(ctx context.Context, p auth.Principal, hash string) (templates.FilesInfo, bool, error)
	PutFiles(ctx context.Context, p auth.Principal, hash string, r io.Reader) (templates.FilesInfo, error)
	MaxUploadBytes() int64
	// FromSandbox saves running sandbox sandboxID's files as template
	// name of its account.
	FromSandbox(ctx context.Context, p auth.Principal, sandboxID, name string) (store.Template, error)
	// Snapshot saves running sandbox sandboxID's files as named snapshot
	// name of its account ("": named by its id; one of that name is
	// replaced). The others act on account accountID's snapshots, which
	// the caller may act for.
	Snapshot(ctx context.Context, p auth.Principal, sandboxID, name string) (store.Template, error)
	Snapshots(ctx context.Context, accountID, sandboxID string) ([]store.Template, error)
	GetSnapshot(ctx context.Context, accountID, ref string) (store.Template, error)
	DeleteSnapshot(ctx context.Context, accountID, ref string) (store.Template, error)
	PromoteSnapshot(ctx context.Context, accountID, ref, name string) (store.Template, error)
}

// VolumeService keeps the accounts' volumes (internal/volumes): account
// is the one the request acts for; ref a volume's name or id. Sizes are
// in bytes.
type VolumeService interface {
	Create(ctx context.Context, account, name string, sizeBytes int64) (volumes.Info, error)
	List(ctx context.Context, account string) ([]volumes.Info, error)
	Get(ctx context.Context, account, ref string) (volumes.Info, error)
	// Delete deletes the volume and its data; refused while attached.
	Delete(ctx context.Context, account, ref string) (volumes.Info, error)
	// Resize grows the volume; refused while attached.
	Resize(ctx context.Context, account, ref string, sizeBytes int64) (volumes.Info, error)
	// Fork makes volume name of account, a copy of ref's data now.
	Fork(ctx context.Context, account, ref, name string) (volumes.Info, error)
}

// EnvironmentService owns the account's environment row (internal/persist).
type EnvironmentService interface {
	// PatchEnvironment applies p and returns the row afterwards, nil when
	// there is none; errdefs classes say what was refused.
	PatchEnvironment(ctx context.Context, accountID string, p persist.EnvironmentPatch) (*store.Environment, error)
}

// AgentService starts the runs of tasks that start sandboxes of their own
// (internal/sandbox).
type AgentService interface {
	CodingAgent(ctx context.Context, accountID string, req sandbox.CodingAgentRequest) (runID string, err error)
	// Setup starts the account's setup-sandbox run, or returns the one
	// already queued or executing.
	Setup(ctx context.Context, accountID string) (runID string, err error)
}
