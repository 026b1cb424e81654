package store

import (
	"encoding/json"
	"errors"
	"time"
)

// ErrNotFound is returned when a row does not exist (or is not visible to the
// account asking; callers never learn which).
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when an insert collides with an existing row.
var ErrConflict = errors.New("conflict")

// AccountKind tells personal accounts from organizations.
type AccountKind string

const (
	AccountPersonal AccountKind = "personal"
	AccountOrg      AccountKind = "org"
)

// Account is a personal account or an organization.
type Account struct {
	ID   string      `json:"id"`
	Name string      `json:"name"`
	Slug string      `json:"slug"`
	Kind AccountKind `json:"kind"`
	// MembersShareAccess (organizations only): members may act for one another.
	MembersShareAccess bool      `json:"members_share_access"`
	CreatedAt          time.Time `json:"created_at"`
}

// APIKey is a stored key. The plaintext is never stored: Hash is the SHA-256
// of the plaintext in lowercase hex and Prefix its first characters, shown to
// tell keys apart.
type APIKey struct {
	ID         string     `json:"id"`
	AccountID  string     `json:"account_id"`
	Name       string     `json:"name"`
	Prefix     string     `json:"prefix"`
	Hash       string     `json:"-"`
	SandboxID  string     `json:"sandbox_id,omitempty"` // set for keys minted for one sandbox
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// SandboxStatus is where a sandbox is in its lifecycle, as the API names it.
type SandboxStatus string

// Sandbox statuses, as the API names them.
const (
	SandboxPending  SandboxStatus = "pending"
	SandboxRunning  SandboxStatus = "running"
	SandboxStopping SandboxStatus = "stopping"
	SandboxStopped  SandboxStatus = "stopped"
	SandboxFailed   SandboxStatus = "failed"
)

// Sandbox is one sandbox's row: the database is the source of truth for its
// lifecycle; the node named by NodeID hosts it.
type Sandbox struct {
	ID            string        `json:"id"`
	AccountID     string        `json:"account_id"`
	NodeID        string        `json:"node_id"`
	Status        SandboxStatus `json:"status"`
	Runtime       string        `json:"runtime"`
	FailureReason string        `json:"failure_reason,omitempty"`
	SnapshotID    string        `json:"snapshot_id,omitempty"` // the snapshot it started from
	// Network is the sandbox's network policy as the API's JSON ("" = none).
	Network   string     `json:"network,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
	Deadline  time.Time  `json:"deadline"`
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// Pause is where a running sandbox is in a pause: "" (not paused),
	// PausePausing, PausePaused or PauseResuming; Status stays running.
	Pause string `json:"pause,omitempty"`
	// PausedRemaining is the lifetime it had left when its pause began
	// (its deadline does not run while it is paused).
	PausedRemaining time.Duration `json:"paused_remaining,omitempty"`
	// ForkedFrom is the sandbox it was forked from, whose memory and
	// filesystem it started with ("": started from its account's snapshot
	// or from nothing).
	ForkedFrom string `json:"forked_from,omitempty"`
	// OnTimeout is what its deadline does: "" stops it, OnTimeoutPause
	// pauses it with its memory, OnTimeoutPauseFiles with its files alone.
	OnTimeout string `json:"on_timeout,omitempty"`
	// Task is the service's task that started it for its account, as
	// runs name tasks (SandboxTaskSetup, "coding-agent"); "" for one the
	// account asked for.
	Task string `json:"task,omitempty"`
	// TemplateID is the template it started from ("": the built-in
	// image). A sandbox of a template never starts from, nor writes, its
	// account's snapshot (docs/TEMPLATES.md).
	TemplateID string `json:"template_id,omitempty"`
	// PausedFiles says its pause kept its files alone: its processes and
	// memory ended, its files are template TemplateID (saved when it
	// paused), and a resume starts it again from them on any node.
	PausedFiles bool `json:"paused_files,omitempty"`
	// PausedState is the blob store's key of a memory pause's saved state
	// (memory and files), kept besides the node's own copy in a cluster:
	// another node resumes it from there once its node is gone ("": the
	// pause is its node's alone).
	PausedState string `json:"paused_state,omitempty"`
	// Volumes are the volumes to attach, in mount order: CreateSandbox
	// records them (the leases) with the row, or refuses the row with a
	// *VolumeBusyError. Not a column: SandboxVolumes reads them back.
	Volumes []VolumeAttachment `json:"-"`
}

// FilesPaused says sb is paused with its files alone (PausedFiles, the
// pause ended): nothing of it is on its node, and any node resumes it.
func (sb Sandbox) FilesPaused() bool {
	return sb.Status == SandboxRunning && sb.PausedFiles && sb.Pause == PausePaused
}

// Movable says sb is paused with its memory and its saved state is in the
// blob store (PausedState): another node resumes it once its own is gone.
func (sb Sandbox) Movable() bool {
	return sb.Status == SandboxRunning && sb.Pause == PausePaused && sb.PausedState != ""
}

// SandboxTaskSetup is the Task of the sandbox an account's setup runs in
// (the setup-sandbox task): the account's lists leave it out.
const SandboxTaskSetup = "setup-sandbox"

// What a sandbox's deadline does besides stopping it: OnTimeoutPause
// pauses it with its memory, OnTimeoutPauseFiles with its files alone
// (Sandbox.PausedFiles).
const (
	OnTimeoutPause      = "pause"
	OnTimeoutPauseFiles = "pause-files"
)

// Pause states of a running sandbox, as the API names them.
const (
	PausePausing  = "pausing"
	PausePaused   = "paused"
	PauseResuming = "resuming"
)

// RunStatus is where a run is, as trigger.dev v3 names it.
type RunStatus string

// Run statuses, as trigger.dev v3 names them: only values of the published
// TaskRunResponse enum that the original's web clients know (a run cut by
// its sandbox's deadline is FAILED, its error says so).
const (
	RunQueued    RunStatus = "QUEUED"
	RunExecuting RunStatus = "EXECUTING"
	RunCompleted RunStatus = "COMPLETED"
	RunFailed    RunStatus = "FAILED"
	RunCrashed   RunStatus = "CRASHED"
	RunCanceled  RunStatus = "CANCELED"
)

// Run is one background task execution.
type Run struct {
	ID         string          `json:"id"` // run_...
	AccountID  string          `json:"account_id"`
	SandboxID  string          `json:"sandbox_id,omitempty"`
	Task       string          `json:"task"` // run-sandbox-command | setup-sandbox | coding-agent
	Status     RunStatus       `json:"status"`
	Payload    json.RawMessage `json:"payload"`
	Output     json.RawMessage `json:"output,omitempty"`
	Error      json.RawMessage `json:"error,omitempty"`
	Tags       []string        `json:"tags"`
	CreatedAt  time.Time       `json:"created_at"`
	UpdatedAt  time.Time       `json:"updated_at"`
	StartedAt  *time.Time      `json:"started_at,omitempty"`
	FinishedAt *time.Time      `json:"finished_at,omitempty"`
}

// Snapshot is a captured sandbox filesystem layer stored in blob storage.
type Snapshot struct {
	ID        string    `json:"id"`
	AccountID string    `json:"account_id"`
	ParentID  string    `json:"parent_id,omitempty"`
	BaseImage string    `json:"base_image"`
	BlobKey   string    `json:"blob_key"` // content address (sha256 hex)
	Size      int64     `json:"size"`
	Depth     int       `json:"depth"` // chain length to the base
	SandboxID string    `json:"sandbox_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Environment is the account's "snapshot row" of the API: which snapshot new
// sandboxes start from and which repository backs the account.
type Environment struct {
	AccountID  string    `json:"account_id"`
	SnapshotID *string   `json:"snapshot_id"`
	GithubRepo *string   `json:"github_repo"`
	ExpiresAt  time.Time `json:"expires_at"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Node is one sandboxd serve process that hosts sandboxes.
type Node struct {
	ID          string    `json:"id"`
	Hostname    string    `json:"hostname"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// Address is where other nodes reach its cluster listener ("": a
	// node that is not in a cluster).
	Address string `json:"address,omitempty"`
	// Status is NodeUp while it heartbeats, NodeDown once another node
	// declared it dead (at DownAt).
	Status string    `json:"status"`
	DownAt time.Time `json:"down_at,omitzero"`
	// Schedule is the operator's: "" (takes new sandboxes), NodeCordoned
	// or NodeDraining (takes none).
	Schedule string       `json:"schedule,omitempty"`
	Capacity NodeCapacity `json:"capacity"`
	Version  string       `json:"version,omitempty"`
}

// Node states.
const (
	NodeUp   = "up"
	NodeDown = "down"
	// NodeCordoned takes no new sandboxes and keeps those it has.
	NodeCordoned = "cordoned"
	// NodeDraining takes no new sandboxes and stops those it has.
	NodeDraining = "draining"
)

// NodeCapacity is what a node offers new sandboxes.
type NodeCapacity struct {
	CPUs         int    `json:"cpus"`
	MemoryBytes  int64  `json:"memory_bytes"`
	DiskBytes    int64  `json:"disk_bytes"`    // free on its data dir when it started
	MaxSandboxes int    `json:"max_sandboxes"` // 0: unlimited
	Runtime      string `json:"runtime"`       // its backend: "gvisor", "microvm"
	// What the backend can do.
	Network        bool `json:"network"`
	MemorySnapshot bool `json:"memory_snapshot"`
	Fork           bool `json:"fork"`
}
