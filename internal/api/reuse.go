package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// What other front ends of the same services (internal/mcpserver) reuse,
// so that they validate, authorise and answer exactly as the routes do:
// one set of rules and messages, not two that drift apart.

// Args are a JSON object of named values (an MCP tool's arguments)
// checked field by field with the routes' own rules and messages.
type Args struct{ o object }

// DecodeArgs decodes a JSON object; empty or null is {}.
func DecodeArgs(data []byte) (Args, error) {
	if string(data) == "null" {
		data = nil
	}
	o, err := decodeObject(data)
	return Args{o}, err
}

// CreateSandbox checks the arguments as POST /api/sandboxes checks its body.
func (a Args) CreateSandbox() (CreateSandboxRequest, error) { return parseCreateSandbox(a.o) }

// Exec checks the arguments as POST /api/sandboxes/{id}/exec checks its
// body. The command dies with the call: a tool call lasts as long as the
// HTTP request that carries it, so a client that hangs up leaves nothing
// running for nobody.
func (a Args) Exec() (ExecRequest, error) {
	req, err := parseExec(a.o)
	req.KillOnDisconnect = true
	return req, err
}

// UploadFiles checks the arguments as POST /api/sandboxes/files checks its
// JSON body.
func (a Args) UploadFiles() (UploadFilesRequest, error) { return parseUploadFiles(a.o) }

// AccountID is the optional account_id, checked to be a UUID.
func (a Args) AccountID() (string, error) { return a.o.accountID() }

// Has reports whether the field is present and not null.
func (a Args) Has(name string) bool { return a.o.present(name) }

// String is an optional string field; ok is false when it is absent.
func (a Args) String(name string) (s string, ok bool, err error) { return a.o.str(name) }

// Int is an optional integer field.
func (a Args) Int(name string) (n int64, ok bool, err error) { return a.o.int(name) }

// Bool is an optional boolean field.
func (a Args) Bool(name string) (b, ok bool, err error) { return a.o.bool(name) }

// RepoPath is a required path inside the repository, cleaned as
// GET /api/sandboxes/file cleans its path.
func (a Args) RepoPath(name string) (string, error) {
	p, ok, err := a.o.str(name)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", errField(name+" is required", name)
	}
	p, err = cleanRepoPath(p, false)
	if err != nil {
		return "", errField(err.Error(), name)
	}
	return p, nil
}

// AuthError maps internal/auth's errors to the contract's errors (401,
// 403, 400), as the routes answer them.
func AuthError(err error) error { return authError(err) }

// ServiceError maps a service's error onto the contract; notFound is the
// message of a 404.
func ServiceError(err error, notFound string) error { return serviceError(err, notFound) }

// CreateError maps an error of SandboxService.Create as POST /api/sandboxes
// does. shown is false for an error not meant for the caller: it is
// answered "Failed to create sandbox" and should be logged.
func CreateError(err error) (mapped error, shown bool) {
	if e, ok := serviceError(err, "").(*Error); ok {
		return e, true
	}
	return errBadRequest("Failed to create sandbox"), false
}

// WriteError answers err with the contract's error body.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	writeError(w, r, log, err)
}

// ViewSandbox renders a sandbox row as the contract's Sandbox object as of
// now.
func ViewSandbox(sb store.Sandbox, now time.Time) Sandbox {
	var remaining int64
	status := string(sb.Status)
	switch {
	case sb.Status == store.SandboxRunning && sb.Pause != "":
		// In a pause its clock is stopped: what it will have at resume.
		status, remaining = sb.Pause, sb.PausedRemaining.Milliseconds()
	case sb.Status == store.SandboxPending || sb.Status == store.SandboxRunning:
		remaining = max(0, sb.Deadline.Sub(now).Milliseconds())
	}
	view := Sandbox{
		SandboxID:     sb.ID,
		SandboxStatus: status,
		Timeout:       remaining,
		CreatedAt:     formatTime(sb.CreatedAt),
		Runtime:       sb.Runtime,
		ForkedFrom:    sb.ForkedFrom,
	}
	if sb.Status == store.SandboxFailed {
		// The column also says why a stopped sandbox stopped, which is
		// no failure.
		view.FailureReason = sb.FailureReason
	}
	// The row holds what the API accepted; a row that does not parse
	// (never written so) shows no policy rather than failing the view.
	var p netpol.Policy
	if sb.Network != "" && json.Unmarshal([]byte(sb.Network), &p) == nil {
		view.Network = &p
	}
	return view
}

// ViewRun renders a run as GET /api/tasks/runs does, as of now.
func ViewRun(run store.Run, now time.Time) Run { return runView(run, now) }

// IsBinary reports whether GET /api/sandboxes/file sends the file base64.
func IsBinary(name string, data []byte) bool { return isBinary(name, data) }

// MaxExecOutput is what a non-streamed exec keeps of each stream.
const MaxExecOutput = maxExecOutput

// ScopeError is the 403 a sandbox's key gets for what it may not do; what
// names the operation ("POST /api/sandboxes", "the run_command tool").
func ScopeError(what string) error {
	return &Error{Status: http.StatusForbidden, Msg: fmt.Sprintf("This key belongs to a sandbox and may only read (GET) the API, use the git server and the model proxy; %s needs an account key", what)}
}
