package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// maxUploadFiles bounds one upload request.
const maxUploadFiles = 100

// ParseCreateSandbox validates the body of POST /api/sandboxes in the order
// of the original schema, reporting the first failing field.
func ParseCreateSandbox(a Args) (CreateSandboxRequest, error) {
	o := a.o
	var req CreateSandboxRequest
	cmd, hasCmd, err := o.str("command")
	if err != nil {
		return req, err
	}
	if hasCmd && cmd == "" {
		return req, FieldError("command cannot be empty", "command")
	}
	if req.Args, _, err = o.strings("args"); err != nil {
		return req, err
	}
	if req.Cwd, _, err = o.str("cwd"); err != nil {
		return req, err
	}
	prompt, hasPrompt, err := o.str("prompt")
	if err != nil {
		return req, err
	}
	if hasPrompt && prompt == "" {
		return req, FieldError("prompt cannot be empty", "prompt")
	}
	if req.AccountID, err = o.accountID(); err != nil {
		return req, err
	}
	timeout, _, err := o.millis("timeout", false)
	if err != nil {
		return req, err
	}
	if o.present("network") {
		p, err := o.network()
		if err != nil {
			return req, err
		}
		req.Network = &p
	}
	if hasCmd && hasPrompt {
		return req, FieldError("Cannot specify both command and prompt", "prompt")
	}
	tpl, hasTpl, err := o.str("template")
	if err != nil {
		return req, err
	}
	if hasTpl && tpl == "" {
		return req, FieldError("template cannot be empty", "template")
	}
	snap, hasSnap, err := o.str("snapshot")
	if err != nil {
		return req, err
	}
	if hasSnap && snap == "" {
		return req, FieldError("snapshot cannot be empty", "snapshot")
	}
	if hasTpl && hasSnap {
		return req, FieldError("Cannot specify both template and snapshot", "snapshot")
	}
	onTimeout, _, err := o.str("on_timeout")
	if err != nil {
		return req, err
	}
	switch onTimeout {
	case "", "stop":
		onTimeout = ""
	case store.OnTimeoutPause, store.OnTimeoutPauseFiles:
	default:
		return req, FieldError("on_timeout must be stop, pause or pause-files", "on_timeout")
	}
	if req.Volumes, err = parseVolumeMounts(o); err != nil {
		return req, err
	}
	req.Command, req.Prompt, req.Timeout, req.Template, req.Snapshot, req.OnTimeout = cmd, prompt, timeout, tpl, snap, onTimeout
	return req, nil
}

// ParsePatchSandboxes validates the body of PATCH /api/sandboxes.
func ParsePatchSandboxes(a Args) (PatchSandboxesRequest, error) {
	o := a.o
	var req PatchSandboxesRequest
	id, ok, err := o.str("snapshotId")
	if err != nil {
		return req, err
	}
	if ok && id == "" {
		return req, FieldError("snapshotId cannot be empty", "snapshotId")
	}
	repo, hasRepo, err := o.str("github_repo")
	if err != nil {
		return req, err
	}
	if hasRepo && !isHTTPURL(repo) {
		return req, FieldError("github_repo must be a valid URL", "github_repo")
	}
	if req.AccountID, err = o.accountID(); err != nil {
		return req, err
	}
	req.SnapshotID, req.GithubRepo = id, repo
	return req, nil
}

// PauseRequest is the body of POST /api/sandboxes/{id}/pause.
type PauseRequest struct {
	// Memory false asks for a pause of the files alone.
	Memory    *bool  `json:"memory,omitempty" jsonschema:"description=true (the default): the pause keeps the sandbox's memory and processes on its node; false: it keeps its files alone in the blob store and its processes start afresh when it resumes on any node"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// ActingFor implements ActsFor.
func (r PauseRequest) ActingFor() string { return r.AccountID }

// ParsePause validates the body of POST /api/sandboxes/{id}/pause.
func ParsePause(a Args) (PauseRequest, error) {
	o := a.o
	var req PauseRequest
	m, ok, err := o.bool("memory")
	if err != nil {
		return req, err
	}
	if ok {
		req.Memory = &m
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// ParseAccountOnly validates a body that carries only account_id.
func ParseAccountOnly(a Args) (AccountRequest, error) {
	o := a.o
	id, err := o.accountID()
	return AccountRequest{AccountID: id}, err
}

// ParseUploadFiles validates the body of POST /api/sandboxes/files.
func ParseUploadFiles(a Args) (UploadFilesRequest, error) {
	o := a.o
	var req UploadFilesRequest
	files, ok, err := o.objects("files")
	if err != nil {
		return req, err
	}
	if !ok || len(files) == 0 {
		return req, FieldError("At least one file is required", "files")
	}
	if len(files) > maxUploadFiles {
		return req, FieldError(fmt.Sprintf("At most %d files can be uploaded at once", maxUploadFiles), "files")
	}
	for i, f := range files {
		u, ok, err := f.str("url", "files", i)
		if err != nil {
			return req, err
		}
		if !ok || !isHTTPURL(u) {
			return req, FieldError("Each file must have a valid URL", "files", i, "url")
		}
		name, ok, err := f.str("name", "files", i)
		if err != nil {
			return req, err
		}
		if !ok || name == "" {
			return req, FieldError("Each file must have a name", "files", i, "name")
		}
		if strings.ContainsAny(name, "/\\\x00") || name == "." || name == ".." {
			return req, FieldError("File name must not contain '/' or be '.' or '..'", "files", i, "name")
		}
		req.Files = append(req.Files, UploadFile{URL: u, Name: name})
	}
	dir, _, err := o.str("path")
	if err != nil {
		return req, err
	}
	if req.Path, err = CleanRepoPath(dir, true); err != nil {
		return req, FieldError(err.Error(), "path")
	}
	msg, _, err := o.str("message")
	if err != nil {
		return req, err
	}
	if msg == "" {
		msg = "Upload files via API"
	}
	req.Message = msg
	return req, nil
}

// CleanRepoPath normalises a path inside a repository, refusing absolute
// paths and any escape through "..".
func CleanRepoPath(p string, allowEmpty bool) (string, error) {
	p = strings.Trim(strings.TrimSpace(p), "/")
	if p == "" {
		if allowEmpty {
			return "", nil
		}
		return "", fmt.Errorf("path cannot be empty")
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." || strings.ContainsRune(seg, 0) {
			return "", fmt.Errorf("path must stay inside the repository")
		}
	}
	return path.Clean(p), nil
}

// ParseFileQuery validates the query of GET /api/sandboxes/file.
func ParseFileQuery(q url.Values) (FileQuery, error) {
	var out FileQuery
	if !q.Has("path") {
		return out, BadRequest("path is required")
	}
	p, err := CleanRepoPath(q.Get("path"), false)
	if err != nil {
		return out, BadRequest(err.Error())
	}
	out.Path = p
	out.AccountID, err = QueryAccountID(q)
	return out, err
}

// ParseRunsQuery validates the query of GET /api/tasks/runs.
func ParseRunsQuery(q url.Values) (RunsQuery, error) {
	out := RunsQuery{Limit: 20}
	if q.Has("runId") {
		out.RunID = strings.TrimSpace(q.Get("runId"))
		if out.RunID == "" {
			return out, BadRequest("runId is required")
		}
	}
	var err error
	if out.Limit, err = QueryLimit(q, out.Limit); err != nil {
		return out, err
	}
	if out.AccountID, err = QueryAccountID(q); err != nil {
		return out, err
	}
	out.Cursor = q.Get("cursor")
	out.after, err = QueryCursor(out.Cursor)
	return out, err
}

// ParseListQuery validates the query of GET /api/sandboxes.
func ParseListQuery(q url.Values) (ListSandboxesQuery, error) {
	var out ListSandboxesQuery
	out.SandboxID = strings.TrimSpace(q.Get("sandbox_id"))
	var err error
	if out.AccountID, err = QueryAccountID(q); err != nil {
		return out, err
	}
	out.paged = q.Has("limit") || q.Has("cursor")
	if out.Limit, err = QueryLimit(q, MaxSandboxPage); err != nil {
		return out, err
	}
	out.Cursor = q.Get("cursor")
	out.after, err = QueryCursor(out.Cursor)
	return out, err
}

func QueryAccountID(q url.Values) (string, error) {
	id := q.Get("account_id")
	if id == "" {
		return "", nil
	}
	if !auth.IsUUID(id) {
		return "", BadRequest("account_id must be a valid UUID")
	}
	return strings.ToLower(id), nil
}

// ParseExec validates the body of POST /api/sandboxes/{id}/exec.
func ParseExec(a Args) (ExecRequest, error) {
	o := a.o
	var req ExecRequest
	cmd, ok, err := o.str("command")
	if err != nil {
		return req, err
	}
	if !ok || cmd == "" {
		return req, FieldError("command cannot be empty", "command")
	}
	req.Command = cmd
	if req.Args, _, err = o.strings("args"); err != nil {
		return req, err
	}
	if req.Cwd, _, err = o.str("cwd"); err != nil {
		return req, err
	}
	if req.Env, err = o.envMap("env"); err != nil {
		return req, err
	}
	if req.Stdin, _, err = o.str("stdin"); err != nil {
		return req, err
	}
	t, _, err := o.millis("timeout", false)
	if err != nil {
		return req, err
	}
	req.Timeout = t
	if o.present("pty") {
		if req.PTY, err = parsePTY(o["pty"]); err != nil {
			return req, err
		}
	}
	if req.KillOnDisconnect, _, err = o.bool("killOnDisconnect"); err != nil {
		return req, err
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// maxTermSize bounds a terminal's rows and columns.
const maxTermSize = 1000

// parsePTY validates an exec's terminal size: {"rows": 1..1000, "cols":
// 1..1000}.
func parsePTY(raw json.RawMessage) (*PTYSize, error) {
	p, err := decodeObject(raw)
	if err != nil || jsonKind(raw) != "object" {
		return nil, typeError("object", raw, []any{"pty"})
	}
	size, err := termSize(p, "pty")
	if err != nil {
		return nil, err
	}
	return &size, nil
}

// termSize validates the rows and cols of o, a terminal size in the
// field named in (the exec's "pty"), or at the top ("": a resize).
func termSize(o object, in string) (PTYSize, error) {
	var size PTYSize
	for _, f := range []struct {
		name string
		v    *int
	}{{"rows", &size.Rows}, {"cols", &size.Cols}} {
		name, path := f.name, []any{f.name}
		if in != "" {
			name, path = in+"."+f.name, []any{in, f.name}
		}
		n, ok, err := o.int(f.name)
		if err != nil {
			return size, FieldError(name+" must be an integer", path...)
		}
		if !ok || n < 1 || n > maxTermSize {
			return size, FieldError(fmt.Sprintf("%s must be between 1 and %d", name, maxTermSize), path...)
		}
		*f.v = int(n)
	}
	return size, nil
}

// ParseTimeout validates the body of POST /api/sandboxes/{id}/timeout.
func ParseTimeout(a Args) (TimeoutRequest, error) {
	o := a.o
	var req TimeoutRequest
	t, _, err := o.millis("timeout", true)
	if err != nil {
		return req, err
	}
	req.Timeout = t
	req.AccountID, err = o.accountID()
	return req, err
}

// ParseFork validates the body of POST /api/sandboxes/{id}/fork: count
// (default 1) and an optional lifetime for the new sandboxes. The upper
// bound of count is the manager's.
func ParseFork(a Args) (ForkRequest, error) {
	o := a.o
	req := ForkRequest{Count: 1}
	n, ok, err := o.int("count")
	if err != nil {
		return req, err
	}
	if ok {
		if n < 1 || n > sandbox.MaxForkCount {
			return req, FieldError(fmt.Sprintf("count must be between 1 and %d", sandbox.MaxForkCount), "count")
		}
		req.Count = int(n)
	}
	if req.Timeout, _, err = o.millis("timeout", false); err != nil {
		return req, err
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// ParseNetworkChange validates the body of PATCH
// /api/sandboxes/{id}/network: a policy, validated as the create field.
func ParseNetworkChange(a Args) (NetworkRequest, error) {
	o := a.o
	var req NetworkRequest
	if !o.present("network") {
		return req, FieldError("network is required", "network")
	}
	p, err := o.network()
	if err != nil {
		return req, err
	}
	req.Network = p
	req.AccountID, err = o.accountID()
	return req, err
}

// network parses and validates the "network" field, once for every route
// that takes a policy.
func (o object) network() (netpol.Policy, error) {
	var p netpol.Policy
	if err := json.Unmarshal(o["network"], &p); err != nil {
		var pe *netpol.PolicyError
		if errors.As(err, &pe) {
			return p, FieldError(pe.Msg, "network")
		}
		// The JSON decoder's own errors (a value of the wrong type).
		return p, FieldError("network: "+err.Error(), "network")
	}
	return p, nil
}

// ParseCodingAgent validates the body of POST /api/tasks/coding-agent.
func ParseCodingAgent(a Args) (CodingAgentRequest, error) {
	o := a.o
	var req CodingAgentRequest
	u, ok, err := o.str("repo_url")
	if err != nil {
		return req, err
	}
	if !ok || !isHTTPURL(u) {
		return req, FieldError("repo_url must be a valid URL", "repo_url")
	}
	p, ok, err := o.str("prompt")
	if err != nil {
		return req, err
	}
	if !ok || p == "" {
		return req, FieldError("prompt cannot be empty", "prompt")
	}
	b, _, err := o.str("base_branch")
	if err != nil {
		return req, err
	}
	if b == "" {
		b = "main"
	}
	if strings.HasPrefix(b, "-") || strings.ContainsAny(b, " ~^:?*[\\\x00") || strings.Contains(b, "..") {
		return req, FieldError("base_branch must be a valid branch name", "base_branch")
	}
	req.RepoURL, req.Prompt, req.BaseBranch = u, p, b
	req.AccountID, err = o.accountID()
	return req, err
}

// QueryLimit is a list's limit parameter: 1 to 100, dflt when absent.
func QueryLimit(q url.Values, dflt int) (int, error) {
	if !q.Has("limit") {
		return dflt, nil
	}
	n, err := strconv.Atoi(q.Get("limit"))
	if err != nil || n < 1 || n > 100 {
		return dflt, BadRequest("limit must be an integer between 1 and 100")
	}
	return n, nil
}
