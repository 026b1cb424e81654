package contract

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Args are a JSON object of named values (a body, an MCP tool's arguments)
// checked field by field with the routes' own rules and messages: how
// another front end of the same services (internal/mcpserver) speaks the
// REST contract, not with a second set of rules that drifts apart.
type Args struct{ o object }

// DecodeArgs decodes a JSON object; empty or null is {}.
func DecodeArgs(data []byte) (Args, error) {
	if string(data) == "null" {
		data = nil
	}
	return DecodeObject(data)
}

// DecodeObject decodes a JSON object (a body, a websocket's message); empty
// is {}, anything but an object is the contract's 400.
func DecodeObject(data []byte) (Args, error) {
	o, err := decodeObject(data)
	return Args{o}, err
}

// CreateSandbox checks the arguments as POST /api/sandboxes checks its body.
func (a Args) CreateSandbox() (CreateSandboxRequest, error) { return ParseCreateSandbox(a) }

// Exec checks the arguments as POST /api/sandboxes/{id}/exec checks its
// body. The command dies with the call: a tool call lasts as long as the
// HTTP request that carries it, so a client that hangs up leaves nothing
// running for nobody.
func (a Args) Exec() (ExecRequest, error) {
	req, err := ParseExec(a)
	req.KillOnDisconnect = true
	return req, err
}

// UploadFiles checks the arguments as POST /api/sandboxes/files checks its
// JSON body.
func (a Args) UploadFiles() (UploadFilesRequest, error) { return ParseUploadFiles(a) }

// AccountID is the optional account_id, checked to be a UUID.
func (a Args) AccountID() (string, error) { return a.o.accountID() }

// Has reports whether the field is present and not null.
func (a Args) Has(name string) bool { return a.o.present(name) }

// String is an optional string field; ok is false when it is absent.
func (a Args) String(name string) (s string, ok bool, err error) { return a.o.str(name) }

// TermSize is the terminal size of the object field in ("": the object
// itself), checked as an exec's pty is.
func (a Args) TermSize(in string) (PTYSize, error) { return termSize(a.o, in) }

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
		return "", FieldError(name+" is required", name)
	}
	p, err = CleanRepoPath(p, false)
	if err != nil {
		return "", FieldError(err.Error(), name)
	}
	return p, nil
}

// CreateError maps an error of SandboxService.Create as POST /api/sandboxes
// does: a request's own mistake, a quota, an invalid request, a template
// not found (404) or not ready (409) is told as
// edge.Explain tells it; anything else (shown false: log it) is answered
// "Failed to create sandbox", as the original API did.
func CreateError(err error) (mapped *edge.Error, shown bool) {
	e, internal := edge.Explain(err, "")
	var own *edge.Error
	// A template that is unknown (404), building or failed (409) says so.
	if internal || !(errors.As(err, &own) || errors.Is(err, errdefs.ErrQuota) || errors.Is(err, errdefs.ErrInvalid) ||
		errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrConflict)) {
		return BadRequest("Failed to create sandbox"), false
	}
	return e, true
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
		CreatedAt:     FormatTime(sb.CreatedAt),
		Runtime:       sb.Runtime,
		ForkedFrom:    sb.ForkedFrom,
		TemplateID:    sb.TemplateID,
		PausedFiles:   sb.PausedFiles,
		OnTimeout:     sb.OnTimeout,
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

// MaxExecOutput bounds what a non-streamed exec keeps of each stream; the
// streamed form has no bound.
const MaxExecOutput = 1 << 20

// Code validates the arguments as the body of POST
// /api/sandboxes/{id}/code.
func (a Args) Code() (CodeRequest, error) { return ParseCode(a) }
