package contract

import (
	"encoding/json"

	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The request and response types of the contract. They are the single
// source of the OpenAPI document (jsonschema tags) and of the handlers'
// answers, so the two cannot drift apart.

// Sandbox is the contract's Sandbox object.
type Sandbox struct {
	SandboxID     string `json:"sandboxId" jsonschema:"description=Unique identifier for the sandbox"`
	SandboxStatus string `json:"sandboxStatus" jsonschema:"enum=pending,enum=running,enum=stopping,enum=stopped,enum=failed,enum=pausing,enum=paused,enum=resuming,description=Current lifecycle state of the sandbox (pausing/paused/resuming: sandboxd's pause of a running sandbox)"`
	Timeout       int64  `json:"timeout" jsonschema:"description=Milliseconds remaining before the sandbox stops automatically (0 once stopped; while paused the clock is stopped and this is what it will have when it resumes)"`
	CreatedAt     string `json:"createdAt" jsonschema:"format=date-time"`
	RunID         string `json:"runId,omitempty" jsonschema:"description=The sandbox's latest run (in the create's answer the one started with it); poll GET /api/tasks/runs?runId="`
	Runtime       string `json:"runtime,omitempty" jsonschema:"description=Isolation backend of the sandbox (sandboxd)"`
	// Network is the sandbox's network policy now (sandboxd): "none",
	// "egress" or {"allow": [...]}; PATCH /api/sandboxes/{id}/network
	// changes it.
	Network *netpol.Policy `json:"network,omitempty"`
	// NetworkBytes is what the network of a running sandbox carried so
	// far (sandboxd), as IP packets with their headers.
	NetworkBytes *NetworkBytes `json:"network_bytes,omitempty"`
	// ForkedFrom is the sandbox it was forked from (sandboxd).
	ForkedFrom string `json:"forkedFrom,omitempty" jsonschema:"description=The sandbox whose memory and filesystem it started from (POST /api/sandboxes/{id}/fork; sandboxd)"`
	// TemplateID is the custom template it started from (sandboxd).
	TemplateID string `json:"templateId,omitempty" jsonschema:"description=The custom template it started from (its id: GET /api/templates/{id}); absent for the server's built-in image; after a pause of its files alone: its saved files (sandboxd)"`
	// PausedFiles says its pause keeps its files alone (sandboxd).
	PausedFiles bool `json:"pausedFiles,omitempty" jsonschema:"description=Present (true) while it is paused with its files alone: its processes start afresh at the resume (sandboxd)"`
	// OnTimeout is what its timeout does, when not a stop (sandboxd).
	OnTimeout string `json:"onTimeout,omitempty" jsonschema:"enum=pause,enum=pause-files,description=What its timeout does when it is not a stop (sandboxd)"`
	// FailureReason says why a failed sandbox failed (sandboxd): a phrase
	// for its user, never a host path or an internal error.
	FailureReason string `json:"failureReason,omitempty" jsonschema:"description=Why the sandbox failed in words for its user; only when sandboxStatus is failed (sandboxd)"`
}

// NetworkBytes counts a sandbox's network traffic (sandboxd): sent by the
// sandbox and received by it, drops of its policy included.
type NetworkBytes struct {
	Sent     uint64 `json:"sent"`
	Received uint64 `json:"received"`
}

// FileTreeEntry is one entry of a repository's recursive tree.
type FileTreeEntry = files.TreeEntry

// SnapshotRow is the account's environment row. It is only sent once the
// row has a snapshot: the published UpdateSnapshotResponse types
// snapshot_id as a string, so a row without one is answered as null.
type SnapshotRow struct {
	AccountID  string  `json:"account_id" jsonschema:"format=uuid"`
	SnapshotID string  `json:"snapshot_id"`
	ExpiresAt  string  `json:"expires_at" jsonschema:"format=date-time"`
	GithubRepo *string `json:"github_repo" jsonschema:"nullable"`
	CreatedAt  string  `json:"created_at" jsonschema:"format=date-time"`
}

// CreateSandboxRequest is the body of POST /api/sandboxes.
type CreateSandboxRequest struct {
	Command   string   `json:"command,omitempty" jsonschema:"minLength=1,description=Command to run in the sandbox (not with prompt)"`
	Args      []string `json:"args,omitempty"`
	Cwd       string   `json:"cwd,omitempty" jsonschema:"description=Working directory (default /workspace, or the template's WORKDIR)"`
	Prompt    string   `json:"prompt,omitempty" jsonschema:"minLength=1,description=Prompt for opencode run (not with command)"`
	AccountID string   `json:"account_id,omitempty" jsonschema:"format=uuid"`
	Timeout   int64    `json:"timeout,omitempty" jsonschema:"minimum=1,description=Lifetime in milliseconds (sandboxd; default 10 minutes)"`
	// Network is the sandbox's network policy (sandboxd): "none", "egress",
	// or {"allow": ["cidr, address, domain or *.domain", ...]}.
	Network *netpol.Policy `json:"network,omitempty"`
	// Template starts the sandbox from a template (sandboxd).
	Template string `json:"template,omitempty" jsonschema:"minLength=1,maxLength=192,description=Template to start from: name[:tag] of one of the account's templates or a public one; it must be ready (sandboxd)"`
	// Snapshot starts the sandbox from a named snapshot (sandboxd).
	Snapshot string `json:"snapshot,omitempty" jsonschema:"minLength=1,maxLength=192,description=Named snapshot to start from: name[:tag] or id of one of the account's snapshots (POST /api/sandboxes/{id}/snapshots); not with template (sandboxd)"`
	// OnTimeout is what the sandbox's deadline does (sandboxd).
	OnTimeout string `json:"on_timeout,omitempty" jsonschema:"enum=stop,enum=pause,enum=pause-files,description=What the timeout does: stop (the default); pause (memory and processes kept; resumed by any use); pause-files (files kept in the blob store; processes start afresh at the resume on any node) (sandboxd)"`
	// Volumes are the account's volumes mounted into the sandbox
	// (sandboxd; POST /api/volumes).
	Volumes []VolumeMount `json:"volumes,omitempty" jsonschema:"maxItems=8,description=The account's volumes to mount (POST /api/volumes): 404 for one it does not have; 409 for one another sandbox has read-write (or has at all when this mount is read-write) and on a gVisor server for one a microVM had read-write; 400 for a bad or overlapping path or a volume named twice (sandboxd)"`
}

// SandboxesResponse answers POST /api/sandboxes.
type SandboxesResponse struct {
	Status    string    `json:"status" jsonschema:"enum=success"`
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ListSandboxesResponse answers GET /api/sandboxes.
type ListSandboxesResponse struct {
	Status     string          `json:"status" jsonschema:"enum=success"`
	Sandboxes  []Sandbox       `json:"sandboxes"`
	SnapshotID *string         `json:"snapshot_id" jsonschema:"nullable"`
	GithubRepo *string         `json:"github_repo" jsonschema:"nullable"`
	Filetree   []FileTreeEntry `json:"filetree" jsonschema:"nullable,description=null when the repository could not be listed"`
	// FiletreeTruncated is set when the tree was cut at the server's
	// limits (entries or path bytes) and filetree holds its beginning
	// only (sandboxd).
	FiletreeTruncated bool `json:"filetree_truncated,omitempty" jsonschema:"description=Present (true) when filetree was cut at the server's limits; clone the repository for the rest (sandboxd)"`
}

// PatchSandboxesRequest is the body of PATCH /api/sandboxes.
type PatchSandboxesRequest struct {
	SnapshotID string `json:"snapshotId,omitempty" jsonschema:"minLength=1"`
	GithubRepo string `json:"github_repo,omitempty" jsonschema:"format=uri"`
	AccountID  string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// AccountRequest is a body naming only the account to act for.
type AccountRequest struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// DeleteSandboxesResponse answers DELETE /api/sandboxes.
type DeleteSandboxesResponse struct {
	Status          string       `json:"status" jsonschema:"enum=success"`
	DeletedSnapshot *SnapshotRow `json:"deleted_snapshot" jsonschema:"nullable"`
}

// UploadFile names one file to download into the repository.
type UploadFile struct {
	URL  string `json:"url" jsonschema:"format=uri"`
	Name string `json:"name" jsonschema:"minLength=1"`
}

// UploadFilesRequest is the body of POST /api/sandboxes/files.
type UploadFilesRequest struct {
	Files   []UploadFile `json:"files" jsonschema:"minItems=1,maxItems=100"`
	Path    string       `json:"path,omitempty"`
	Message string       `json:"message,omitempty"`
}

// UploadedFile is one committed file.
type UploadedFile = files.Committed

// UploadFilesResponse answers POST /api/sandboxes/files.
type UploadFilesResponse struct {
	Status   string         `json:"status" jsonschema:"enum=success"`
	Uploaded []UploadedFile `json:"uploaded"`
	Errors   []string       `json:"errors,omitempty"`
}

// FileResponse answers GET /api/sandboxes/file.
type FileResponse struct {
	Status   string `json:"status" jsonschema:"enum=success"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"enum=base64"`
}

// RunError is a run's error.
type RunError struct {
	Message string `json:"message"`
}

// Run is the trigger.dev v3 shape of a background task run.
type Run struct {
	ID             string          `json:"id"`
	TaskIdentifier string          `json:"taskIdentifier" jsonschema:"enum=run-sandbox-command,enum=setup-sandbox,enum=coding-agent"`
	Status         string          `json:"status" jsonschema:"enum=QUEUED,enum=EXECUTING,enum=COMPLETED,enum=FAILED,enum=CRASHED,enum=CANCELED,enum=SYSTEM_FAILURE,enum=INTERRUPTED,description=A run cut by its sandbox's deadline is FAILED; its error says so"`
	IsCompleted    bool            `json:"isCompleted"`
	IsSuccess      bool            `json:"isSuccess"`
	IsFailed       bool            `json:"isFailed"`
	CreatedAt      string          `json:"createdAt" jsonschema:"format=date-time"`
	UpdatedAt      string          `json:"updatedAt" jsonschema:"format=date-time"`
	StartedAt      *string         `json:"startedAt" jsonschema:"nullable,format=date-time"`
	FinishedAt     *string         `json:"finishedAt" jsonschema:"nullable,format=date-time"`
	DurationMs     int64           `json:"durationMs" jsonschema:"description=0 before the run starts; elapsed time while it runs"`
	Tags           []string        `json:"tags"`
	Payload        json.RawMessage `json:"payload" jsonschema:"type=object"`
	Output         json.RawMessage `json:"output" jsonschema:"nullable,type=object,description=null until the run has an output"`
	Error          *RunError       `json:"error" jsonschema:"nullable"`
	// SandboxID is the sandbox the run runs in (sandboxd): a command's
	// from the start, a task's once it started one.
	SandboxID string `json:"sandboxId,omitempty" jsonschema:"description=The sandbox the run runs in: a command's from the start and a task's (setup or coding agent) once it started its own (sandboxd)"`
}

// RunsResponse answers GET /api/tasks/runs.
type RunsResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
	Runs   []Run  `json:"runs"`
}

// ExecRequest is the body of POST /api/sandboxes/{id}/exec.
type ExecRequest struct {
	Command   string            `json:"command" jsonschema:"minLength=1"`
	Args      []string          `json:"args,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Stdin     string            `json:"stdin,omitempty"`
	Timeout   int64             `json:"timeout,omitempty" jsonschema:"minimum=1,description=Milliseconds before the command is killed"`
	AccountID string            `json:"account_id,omitempty" jsonschema:"format=uuid"`
	// PTY runs the command on a terminal of this size (sandboxd); its
	// output is then one stream, reported as stdout.
	PTY *PTYSize `json:"pty,omitempty"`
	// KillOnDisconnect makes the command die with its caller (sandboxd):
	// without it, a command whose client goes away runs on in the sandbox.
	KillOnDisconnect bool `json:"killOnDisconnect,omitempty" jsonschema:"description=Kill the command when the client disconnects before it ends (sandboxd). Without it the command runs on in the sandbox until it ends or reaches its timeout or the sandbox's: GET .../processes lists it and DELETE .../processes/{pid} kills it; its output from then on is dropped. The websocket exec always kills its command when the socket closes."`
}

// PTYSize is a terminal's size in characters.
type PTYSize struct {
	Rows int `json:"rows" jsonschema:"minimum=1,maximum=1000"`
	Cols int `json:"cols" jsonschema:"minimum=1,maximum=1000"`
}

// ExecResponse answers a non-streamed exec.
type ExecResponse struct {
	Status     string `json:"status" jsonschema:"enum=success"`
	ExitCode   int    `json:"exitCode"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	DurationMs int64  `json:"durationMs"`
	// OOMKilled: the command or one of its processes was killed for the
	// sandbox's memory limit (sandboxd).
	OOMKilled bool `json:"oomKilled,omitempty"`
	// TimedOut: the command was killed because its timeout passed
	// (sandboxd); its exit code is then that of the kill (137).
	TimedOut bool `json:"timedOut,omitempty" jsonschema:"description=Present (true) when the command was killed because its timeout (or the sandbox's deadline) passed; exitCode is then the kill's, 137 (sandboxd)"`
}

// The events of a streamed exec (Accept: text/event-stream) carry these as
// their data.

// ExecOutput is the data of a "stdout" or "stderr" event: a piece of the
// command's output, as it was written.
type ExecOutput struct {
	Data string `json:"data"`
}

// ExecExit is the data of the "exit" event, the last one of a command that
// ran. Its fields are in the order the event has always had them.
type ExecExit struct {
	DurationMs int64 `json:"durationMs"`
	ExitCode   int   `json:"exitCode"`
	OOMKilled  bool  `json:"oomKilled,omitempty"`
	TimedOut   bool  `json:"timedOut,omitempty"`
}

// ExecFailure is the data of the "error" event, which ends a stream whose
// command could not run (or was cut off).
type ExecFailure struct {
	Error string `json:"error"`
	// StatusCode is the status the non-streamed exec answers this error
	// with (sandboxd): the 200 of a stream is sent before the command
	// starts, so a reader that maps errors by status (the MCP tools of
	// another node) learns it here.
	StatusCode int `json:"statusCode,omitempty"`
}

// PortsResponse answers GET /api/sandboxes/{id}/ports.
type PortsResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
	Ports  []Port `json:"ports"`
}

// Port is a TCP port listening inside a sandbox.
type Port struct {
	Port int `json:"port"`
	// URL reaches it through the port proxy (for sandboxes with a network).
	URL string `json:"url"`
}

// TimeoutRequest is the body of POST /api/sandboxes/{id}/timeout.
type TimeoutRequest struct {
	Timeout   int64  `json:"timeout" jsonschema:"minimum=1,description=New remaining lifetime in milliseconds from now"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ForkRequest is the body of POST /api/sandboxes/{id}/fork (sandboxd).
type ForkRequest struct {
	Count     int    `json:"count,omitempty" jsonschema:"minimum=1,maximum=20,default=1,description=How many sandboxes to start from the sandbox's memory and filesystem"`
	Timeout   int64  `json:"timeout,omitempty" jsonschema:"minimum=1,description=Lifetime of each new sandbox in milliseconds (default: the server's default lifetime)"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// NetworkRequest is the body of PATCH /api/sandboxes/{id}/network
// (sandboxd): the new policy, in the create request's form.
type NetworkRequest struct {
	Network   netpol.Policy `json:"network" jsonschema:"description=The new policy in the form of the create request's network field"`
	AccountID string        `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// CodingAgentRequest is the body of POST /api/tasks/coding-agent.
type CodingAgentRequest struct {
	RepoURL    string `json:"repo_url" jsonschema:"format=uri"`
	Prompt     string `json:"prompt" jsonschema:"minLength=1"`
	BaseBranch string `json:"base_branch,omitempty" jsonschema:"description=Branch to start from (default main)"`
	AccountID  string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// RunResponse answers a route that starts a run (for POST
// /api/sandboxes/setup, the published SetupSandboxResponse).
type RunResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
	RunID  string `json:"runId"`
}

// SandboxResponse answers a route acting on one sandbox.
type SandboxResponse struct {
	Status  string  `json:"status" jsonschema:"enum=success"`
	Sandbox Sandbox `json:"sandbox"`
}

// HealthResponse answers GET /api/health.
type HealthResponse struct {
	Status  string `json:"status" jsonschema:"enum=success"`
	Version string `json:"version"`
	Runtime string `json:"runtime,omitempty" jsonschema:"description=Sandbox backend: its platform and (for gVisor) the runsc version (sandboxd)"`
	// Degraded says what the server lacks and what that costs (sandboxd),
	// one line each; absent when nothing is. The server still serves:
	// status stays success.
	Degraded []string `json:"degraded,omitempty" jsonschema:"description=What is wrong with this server's setup and what is lost; one line each and absent when nothing is: e.g. a fallback to Debian's 2022 gVisor (sandboxd)"`
}

// Query parameter sets, documented in the OpenAPI document.

// ListSandboxesQuery is the query of GET /api/sandboxes.
type ListSandboxesQuery struct {
	SandboxID string `json:"sandbox_id,omitempty"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
	// Limit and Cursor page the list (sandboxd); without either it is the
	// newest UnpagedSandboxes and every active sandbox.
	Limit  int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100,description=Pages the list (sandboxd): at most this many sandboxes newest first; the next page's cursor is in the X-Next-Cursor header. Without limit and cursor the list is the newest 100 sandboxes and every active one (pending or running or stopping) older than those"`
	Cursor string `json:"cursor,omitempty" jsonschema:"description=Where the page begins (sandboxd): the X-Next-Cursor header of the page before"`

	paged bool         // limit or cursor was given
	after store.Cursor // the cursor, decoded
}

// FileQuery is the query of GET /api/sandboxes/file.
type FileQuery struct {
	Path      string `json:"path" jsonschema:"minLength=1"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// RunsQuery is the query of GET /api/tasks/runs.
type RunsQuery struct {
	RunID     string `json:"runId,omitempty"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
	Limit     int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100,default=20"`
	Cursor    string `json:"cursor,omitempty" jsonschema:"description=Where the page begins (sandboxd): the X-Next-Cursor header of the page before; each page of runs sends one while older runs follow"`

	after store.Cursor // the cursor, decoded
}

// ProcessesResponse answers GET /api/sandboxes/{id}/processes.
type ProcessesResponse struct {
	Status    string    `json:"status" jsonschema:"enum=success"`
	Processes []Process `json:"processes"`
}

// Process is a process exec or a run started in a sandbox that still runs.
type Process struct {
	PID int `json:"pid"`
	// Tag names it: a run's id for the command of a run.
	Tag       string   `json:"tag,omitempty"`
	Command   []string `json:"command"`
	Cwd       string   `json:"cwd,omitempty"`
	PTY       bool     `json:"pty"`
	StartedAt string   `json:"startedAt" jsonschema:"format=date-time"`
}

// KillQuery is the query of DELETE /api/sandboxes/{id}/processes/{pid}.
type KillQuery struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
	// Signal to send (default SIGKILL).
	Signal string `json:"signal,omitempty" jsonschema:"enum=SIGKILL,enum=SIGTERM,enum=SIGINT,enum=SIGHUP,enum=SIGQUIT"`
}

// StatusResponse is a bare success.
type StatusResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
}
