package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/sandbox"
)

// maxUploadFiles bounds one upload request.
const maxUploadFiles = 100

// parseCreateSandbox validates the body of POST /api/sandboxes in the order
// of the original schema, reporting the first failing field.
func parseCreateSandbox(o object) (CreateSandboxRequest, error) {
	var req CreateSandboxRequest
	cmd, hasCmd, err := o.str("command")
	if err != nil {
		return req, err
	}
	if hasCmd && cmd == "" {
		return req, errField("command cannot be empty", "command")
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
		return req, errField("prompt cannot be empty", "prompt")
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
		return req, errField("Cannot specify both command and prompt", "prompt")
	}
	req.Command, req.Prompt, req.Timeout = cmd, prompt, timeout
	return req, nil
}

// parsePatchSandboxes validates the body of PATCH /api/sandboxes.
func parsePatchSandboxes(o object) (PatchSandboxesRequest, error) {
	var req PatchSandboxesRequest
	id, ok, err := o.str("snapshotId")
	if err != nil {
		return req, err
	}
	if ok && id == "" {
		return req, errField("snapshotId cannot be empty", "snapshotId")
	}
	repo, hasRepo, err := o.str("github_repo")
	if err != nil {
		return req, err
	}
	if hasRepo && !isHTTPURL(repo) {
		return req, errField("github_repo must be a valid URL", "github_repo")
	}
	if req.AccountID, err = o.accountID(); err != nil {
		return req, err
	}
	req.SnapshotID, req.GithubRepo = id, repo
	return req, nil
}

// parseAccountOnly validates a body that carries only account_id.
func parseAccountOnly(o object) (AccountRequest, error) {
	id, err := o.accountID()
	return AccountRequest{AccountID: id}, err
}

// parseUploadFiles validates the body of POST /api/sandboxes/files.
func parseUploadFiles(o object) (UploadFilesRequest, error) {
	var req UploadFilesRequest
	files, ok, err := o.objects("files")
	if err != nil {
		return req, err
	}
	if !ok || len(files) == 0 {
		return req, errField("At least one file is required", "files")
	}
	if len(files) > maxUploadFiles {
		return req, errField(fmt.Sprintf("At most %d files can be uploaded at once", maxUploadFiles), "files")
	}
	for i, f := range files {
		u, ok, err := f.str("url", "files", i)
		if err != nil {
			return req, err
		}
		if !ok || !isHTTPURL(u) {
			return req, errField("Each file must have a valid URL", "files", i, "url")
		}
		name, ok, err := f.str("name", "files", i)
		if err != nil {
			return req, err
		}
		if !ok || name == "" {
			return req, errField("Each file must have a name", "files", i, "name")
		}
		if strings.ContainsAny(name, "/\\\x00") || name == "." || name == ".." {
			return req, errField("File name must not contain '/' or be '.' or '..'", "files", i, "name")
		}
		req.Files = append(req.Files, UploadFile{URL: u, Name: name})
	}
	dir, _, err := o.str("path")
	if err != nil {
		return req, err
	}
	if req.Path, err = cleanRepoPath(dir, true); err != nil {
		return req, errField(err.Error(), "path")
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

// cleanRepoPath normalises a path inside a repository, refusing absolute
// paths and any escape through "..".
func cleanRepoPath(p string, allowEmpty bool) (string, error) {
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

// parseFileQuery validates the query of GET /api/sandboxes/file.
func parseFileQuery(q url.Values) (FileQuery, error) {
	var out FileQuery
	if !q.Has("path") {
		return out, errBadRequest("path is required")
	}
	p, err := cleanRepoPath(q.Get("path"), false)
	if err != nil {
		return out, errBadRequest(err.Error())
	}
	out.Path = p
	out.AccountID, err = queryAccountID(q)
	return out, err
}

// parseRunsQuery validates the query of GET /api/tasks/runs.
func parseRunsQuery(q url.Values) (RunsQuery, error) {
	out := RunsQuery{Limit: 20}
	if q.Has("runId") {
		out.RunID = strings.TrimSpace(q.Get("runId"))
		if out.RunID == "" {
			return out, errBadRequest("runId is required")
		}
	}
	var err error
	if out.Limit, err = queryLimit(q, out.Limit); err != nil {
		return out, err
	}
	if out.AccountID, err = queryAccountID(q); err != nil {
		return out, err
	}
	out.Cursor = q.Get("cursor")
	out.after, err = queryCursor(out.Cursor)
	return out, err
}

// parseListQuery validates the query of GET /api/sandboxes.
func parseListQuery(q url.Values) (ListSandboxesQuery, error) {
	var out ListSandboxesQuery
	out.SandboxID = strings.TrimSpace(q.Get("sandbox_id"))
	var err error
	if out.AccountID, err = queryAccountID(q); err != nil {
		return out, err
	}
	out.paged = q.Has("limit") || q.Has("cursor")
	if out.Limit, err = queryLimit(q, maxSandboxPage); err != nil {
		return out, err
	}
	out.Cursor = q.Get("cursor")
	out.after, err = queryCursor(out.Cursor)
	return out, err
}

func queryAccountID(q url.Values) (string, error) {
	id := q.Get("account_id")
	if id == "" {
		return "", nil
	}
	if !isUUID(id) {
		return "", errBadRequest("account_id must be a valid UUID")
	}
	return strings.ToLower(id), nil
}

// parseExec validates the body of POST /api/sandboxes/{id}/exec.
func parseExec(o object) (ExecRequest, error) {
	var req ExecRequest
	cmd, ok, err := o.str("command")
	if err != nil {
		return req, err
	}
	if !ok || cmd == "" {
		return req, errField("command cannot be empty", "command")
	}
	req.Command = cmd
	if req.Args, _, err = o.strings("args"); err != nil {
		return req, err
	}
	if req.Cwd, _, err = o.str("cwd"); err != nil {
		return req, err
	}
	if o.present("env") {
		env, err := decodeObject(o["env"])
		if err != nil || jsonKind(o["env"]) != "object" {
			return req, typeError("object", o["env"], []any{"env"})
		}
		req.Env = map[string]string{}
		for k := range env {
			v, _, err := env.str(k, "env")
			if err != nil {
				return req, err
			}
			if k == "" || strings.ContainsAny(k, "=\x00") {
				return req, errField("env names must be non-empty and contain no '='", "env", k)
			}
			req.Env[k] = v
		}
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
			return size, errField(name+" must be an integer", path...)
		}
		if !ok || n < 1 || n > maxTermSize {
			return size, errField(fmt.Sprintf("%s must be between 1 and %d", name, maxTermSize), path...)
		}
		*f.v = int(n)
	}
	return size, nil
}

// parseTimeout validates the body of POST /api/sandboxes/{id}/timeout.
func parseTimeout(o object) (TimeoutRequest, error) {
	var req TimeoutRequest
	t, _, err := o.millis("timeout", true)
	if err != nil {
		return req, err
	}
	req.Timeout = t
	req.AccountID, err = o.accountID()
	return req, err
}

// parseFork validates the body of POST /api/sandboxes/{id}/fork: count
// (default 1) and an optional lifetime for the new sandboxes. The upper
// bound of count is the manager's.
func parseFork(o object) (ForkRequest, error) {
	req := ForkRequest{Count: 1}
	n, ok, err := o.int("count")
	if err != nil {
		return req, err
	}
	if ok {
		if n < 1 || n > sandbox.MaxForkCount {
			return req, errField(fmt.Sprintf("count must be between 1 and %d", sandbox.MaxForkCount), "count")
		}
		req.Count = int(n)
	}
	if req.Timeout, _, err = o.millis("timeout", false); err != nil {
		return req, err
	}
	req.AccountID, err = o.accountID()
	return req, err
}

// parseNetworkChange validates the body of PATCH
// /api/sandboxes/{id}/network: a policy, validated as the create field.
func parseNetworkChange(o object) (NetworkRequest, error) {
	var req NetworkRequest
	if !o.present("network") {
		return req, errField("network is required", "network")
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
			return p, errField(pe.Msg, "network")
		}
		// The JSON decoder's own errors (a value of the wrong type).
		return p, errField("network: "+err.Error(), "network")
	}
	return p, nil
}

// parseCodingAgent validates the body of POST /api/tasks/coding-agent.
func parseCodingAgent(o object) (CodingAgentRequest, error) {
	var req CodingAgentRequest
	u, ok, err := o.str("repo_url")
	if err != nil {
		return req, err
	}
	if !ok || !isHTTPURL(u) {
		return req, errField("repo_url must be a valid URL", "repo_url")
	}
	p, ok, err := o.str("prompt")
	if err != nil {
		return req, err
	}
	if !ok || p == "" {
		return req, errField("prompt cannot be empty", "prompt")
	}
	b, _, err := o.str("base_branch")
	if err != nil {
		return req, err
	}
	if b == "" {
		b = "main"
	}
	if strings.HasPrefix(b, "-") || strings.ContainsAny(b, " ~^:?*[\\\x00") || strings.Contains(b, "..") {
		return req, errField("base_branch must be a valid branch name", "base_branch")
	}
	req.RepoURL, req.Prompt, req.BaseBranch = u, p, b
	req.AccountID, err = o.accountID()
	return req, err
}

// queryLimit is a list's limit parameter: 1 to 100, dflt when absent.
func queryLimit(q url.Values, dflt int) (int, error) {
	if !q.Has("limit") {
		return dflt, nil
	}
	n, err := strconv.Atoi(q.Get("limit"))
	if err != nil || n < 1 || n > 100 {
		return dflt, errBadRequest("limit must be an integer between 1 and 100")
	}
	return n, nil
}
