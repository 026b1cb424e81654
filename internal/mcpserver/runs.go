package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/capbuf"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The arguments of each tool, as their schemas document them. The
// handlers read the raw arguments with contract.Args, so that a bad value is
// refused with the API's own message, not a schema validator's. Network is
// not a pointer although it is optional: the schema library would make a
// pointer's schema "null" only (see networkSchema).

type promptArgs struct {
	Prompt    string           `json:"prompt" jsonschema:"The task for OpenCode, as one would type it; it runs in /workspace, a checkout of the account's repository"`
	Timeout   int64            `json:"timeout,omitempty" jsonschema:"Lifetime of the sandbox in milliseconds (default: the server's, 10 minutes)"`
	Network   netpol.Policy    `json:"network,omitempty"`
	Wait      *bool            `json:"wait,omitempty" jsonschema:"Wait for the run to finish, with progress notifications (default true); false answers at once with the run's id for get_run"`
	Volumes   []volumeMountArg `json:"volumes,omitempty" jsonschema:"The account's volumes to mount in the sandbox (create_volume): their files outlive it"`
	AccountID string           `json:"account_id,omitempty" jsonschema:"Act for this account (an organization key for a member, say); default: the key's own"`
}

type commandArgs struct {
	Command   string            `json:"command" jsonschema:"Program to run (looked up in PATH), never through a shell unless it is one: use sh with args [\"-c\", \"...\"] for shell syntax"`
	Args      []string          `json:"args,omitempty" jsonschema:"Its arguments"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"Working directory (default /workspace)"`
	SandboxID string            `json:"sandbox_id,omitempty" jsonschema:"Run in this running sandbox (as POST /api/sandboxes/{id}/exec) instead of a new one"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"Environment variables (with sandbox_id only)"`
	Stdin     string            `json:"stdin,omitempty" jsonschema:"Standard input (with sandbox_id only)"`
	Timeout   int64             `json:"timeout,omitempty" jsonschema:"Milliseconds: the new sandbox's lifetime or, with sandbox_id, before the command is killed"`
	Network   netpol.Policy     `json:"network,omitempty"`
	Template  string            `json:"template,omitempty" jsonschema:"For a new sandbox: start it from this template (name[:tag], the account's or a public one, ready) instead of the server's image"`
	Snapshot  string            `json:"snapshot,omitempty" jsonschema:"For a new sandbox: start it from this named snapshot of the account (name[:tag] or id: snapshot_sandbox) instead (not with template)"`
	Wait      *bool             `json:"wait,omitempty" jsonschema:"For a new sandbox: wait for the run to finish (default true)"`
	Volumes   []volumeMountArg  `json:"volumes,omitempty" jsonschema:"For a new sandbox: the account's volumes to mount in it (create_volume); their files outlive it"`
	AccountID string            `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

type getRunArgs struct {
	RunID     string `json:"run_id,omitempty" jsonschema:"The run (runId of prompt_sandbox or run_command); without it, the account's latest runs"`
	Limit     int    `json:"limit,omitempty" jsonschema:"How many runs to list without run_id (1 to 100, default 20)"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

// maxRunsListed bounds get_run's limit.
const maxRunsListed = 100

type stopArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"The sandbox to stop"`
	AccountID string `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

func (h *Handler) tools() []tool {
	return []tool{
		{name: "prompt_sandbox", title: "Prompt a sandbox", changes: true, in: reflect.TypeFor[promptArgs](), fn: h.promptSandbox,
			description: "Run a prompt through OpenCode in a new sandbox of the account (as POST /api/sandboxes with prompt), wait for it with progress notifications, and return the run (its output: stdout, stderr, exitCode, the branch its commit was pushed to and the snapshot it left) and the repository's files the run changed."},
		{name: "run_command", title: "Run a command", changes: true, in: reflect.TypeFor[commandArgs](), fn: h.runCommand,
			description: "Run a command in a new sandbox of the account and wait for its run (as POST /api/sandboxes with command), or, with sandbox_id, in a running sandbox (as POST /api/sandboxes/{id}/exec). Returns stdout, stderr and the exit code."},
		{name: "read_file", title: "Read a file", in: reflect.TypeFor[readArgs](), fn: h.readFile,
			description: "Read a file of the account's repository (main, through submodules), as GET /api/sandboxes/file. Text comes back as text, images as images, other binary files as a base64 resource."},
		{name: "write_file", title: "Write a file", changes: true, in: reflect.TypeFor[writeArgs](), fn: h.writeFile,
			description: "Commit one file, given its content, to main of the key's own account's repository (as a multipart POST /api/sandboxes/files). The next sandbox starts with it in /workspace."},
		{name: "upload_files", title: "Upload files from URLs", changes: true, in: reflect.TypeFor[uploadArgs](), fn: h.uploadFiles,
			description: "Download files from URLs and commit them, in one commit, to the key's own account's repository (as POST /api/sandboxes/files)."},
		{name: "list_files", title: "List files", in: reflect.TypeFor[listArgs](), fn: h.listFiles,
			description: "List the account's repository (main) recursively: path, type (blob or tree), sha and size of each entry."},
		{name: "get_run", title: "Get a run", in: reflect.TypeFor[getRunArgs](), fn: h.getRun,
			description: "Get a run by id, or list the account's latest runs (as GET /api/tasks/runs)."},
		{name: "stop_sandbox", title: "Stop a sandbox", changes: true, in: reflect.TypeFor[stopArgs](), fn: h.stopSandbox,
			description: "Stop a sandbox now (as POST /api/sandboxes/{id}/stop); a run in it ends FAILED."},
	}
}

// runResult answers the tools that start a run.
type runResult struct {
	Sandbox contract.Sandbox `json:"sandbox"`
	Run     contract.Run     `json:"run"`
	// Finished is false when the call returned before the run ended (wait
	// false, or the client went away): get_run follows it.
	Finished bool `json:"finished"`
	// ChangedFiles are the files of main that the run added, modified or
	// deleted (prompt_sandbox).
	ChangedFiles []changedFile `json:"changedFiles,omitempty"`
	Note         string        `json:"note,omitempty"`
}

type changedFile struct {
	Path   string `json:"path"`
	Change string `json:"change" jsonschema:"enum=added,enum=modified,enum=deleted"`
}

func (h *Handler) promptSandbox(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	req, err := c.args.CreateSandbox()
	if err != nil {
		return nil, err
	}
	if req.Prompt == "" {
		return nil, contract.FieldError("prompt cannot be empty", "prompt")
	}
	account, err := h.resolve(ctx, c.who, req.AccountID)
	if err != nil {
		return nil, err
	}
	before, beforeCut, err := h.blobs(ctx, account)
	if err != nil {
		return nil, err
	}
	res, err := h.startAndWait(ctx, c, account, req)
	if err != nil {
		return nil, err
	}
	if res.Finished {
		res.ChangedFiles, res.Note, err = h.changes(ctx, account, before, beforeCut, res.Run)
		if err != nil {
			return nil, err
		}
	}
	return runAnswer(res)
}

func (h *Handler) runCommand(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	if c.args.Has("sandbox_id") {
		for _, name := range []string{"template", "snapshot", "volumes"} {
			if c.args.Has(name) {
				return nil, contract.FieldError(name+" is for a new sandbox, not with sandbox_id", name)
			}
		}
		return h.execIn(ctx, c)
	}
	for _, name := range []string{"env", "stdin"} {
		if c.args.Has(name) {
			return nil, contract.FieldError(name+" needs sandbox_id: a new sandbox's run takes command, args and cwd", name)
		}
	}
	req, err := c.args.CreateSandbox()
	if err != nil {
		return nil, err
	}
	if req.Command == "" {
		return nil, contract.FieldError("command cannot be empty", "command")
	}
	account, err := h.resolve(ctx, c.who, req.AccountID)
	if err != nil {
		return nil, err
	}
	res, err := h.startAndWait(ctx, c, account, req)
	if err != nil {
		return nil, err
	}
	return runAnswer(res)
}

// startAndWait creates the sandbox with its run and, unless told not to,
// waits for the run.
func (h *Handler) startAndWait(ctx context.Context, c *call, account string, req contract.CreateSandboxRequest) (runResult, error) {
	wait, hasWait, err := c.args.Bool("wait")
	if err != nil {
		return runResult{}, err
	}
	sb, runID, err := h.create(ctx, c.who, account, req)
	if err != nil {
		return runResult{}, err
	}
	run, err := h.opts.Store.GetRun(ctx, runID)
	if err != nil {
		return runResult{}, fmt.Errorf("get run %s: %w", runID, err)
	}
	finished := contract.ViewRun(run, h.opts.Now()).IsCompleted
	if !hasWait || wait {
		if run, finished, err = h.waitRun(ctx, c.req, runID); err != nil {
			return runResult{}, err
		}
	}
	res := runResult{Sandbox: h.live(ctx, sb), Run: contract.ViewRun(run, h.opts.Now()), Finished: finished}
	if !finished {
		res.Note = "The run has not finished: follow it with get_run {\"run_id\": \"" + runID + "\"}."
	}
	return res, nil
}

// create starts the sandbox with its run where POST /api/sandboxes would:
// in a cluster on the node placement chooses (through that node's API
// when it is another), else here. Errors are answered as that route
// answers them.
func (h *Handler) create(ctx context.Context, who edge.Caller, account string, req contract.CreateSandboxRequest) (store.Sandbox, string, error) {
	node, local, err := h.opts.Gate.Place(ctx, who, req.Network)
	if err != nil {
		return store.Sandbox{}, "", err
	}
	if !local {
		return h.createOn(ctx, node, who, req)
	}
	sb, runID, err := h.opts.Sandboxes.Create(ctx, account, req.Domain())
	if err != nil {
		mapped, shown := contract.CreateError(err)
		if !shown {
			h.log.ErrorContext(ctx, "mcp: create sandbox", "err", err, "account_id", account)
		}
		return sb, "", mapped
	}
	return sb, runID, nil
}

// live is the sandbox as its host reports it now.
func (h *Handler) live(ctx context.Context, sb store.Sandbox) contract.Sandbox {
	if cur, err := h.opts.Store.GetSandbox(ctx, sb.ID); err == nil {
		sb = cur
	}
	if rows := h.opts.Sandboxes.Live(ctx, []store.Sandbox{sb}); len(rows) == 1 {
		sb = rows[0]
	}
	return contract.ViewSandbox(sb, h.opts.Now())
}

// waitRun polls the run until it has ended, sending a progress
// notification at each look when the client asked for them. It returns
// early, with finished false, when the call is cancelled or the client
// can no longer be told.
func (h *Handler) waitRun(ctx context.Context, req *mcp.CallToolRequest, runID string) (run store.Run, finished bool, err error) {
	notify := progress(req)
	start := h.opts.Now()
	tick := time.NewTicker(h.opts.PollInterval)
	defer tick.Stop()
	for {
		run, err = h.opts.Store.GetRun(ctx, runID)
		if ctx.Err() != nil {
			return run, false, nil
		}
		if err != nil {
			return run, false, fmt.Errorf("get run %s: %w", runID, err)
		}
		now := h.opts.Now()
		if contract.ViewRun(run, now).IsCompleted {
			return run, true, nil
		}
		elapsed := now.Sub(start)
		if err := notify(ctx, elapsed.Seconds(), fmt.Sprintf("run %s is %s after %s", run.ID, run.Status, elapsed.Round(time.Second))); err != nil {
			return run, false, nil
		}
		select {
		case <-ctx.Done():
			return run, false, nil
		case <-tick.C:
		}
	}
}

// progress returns a function that sends the call's progress
// notifications, or does nothing when the client sent no progress token.
func progress(req *mcp.CallToolRequest) func(ctx context.Context, done float64, msg string) error {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func(context.Context, float64, string) error { return nil }
	}
	return func(ctx context.Context, done float64, msg string) error {
		return req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: done, Message: msg})
	}
}

// blobs maps the paths of main's files to their blob ids; nil when the
// account has no repository yet. cut says the listing stopped at the
// server's limits, so the map is not the whole of main.
func (h *Handler) blobs(ctx context.Context, account string) (m map[string]string, cut bool, err error) {
	url, err := h.opts.Files.RepoURL(ctx, account)
	if err != nil || url == "" {
		return nil, false, err
	}
	tree, cut, err := h.tree(ctx, account)
	if err != nil {
		return nil, false, err
	}
	m = make(map[string]string, len(tree))
	for _, e := range tree {
		if e.Type == "blob" {
			m[e.Path] = e.SHA
		}
	}
	return m, cut, nil
}

// changes lists what a finished run changed on main: the files whose
// blobs differ between before the run and now. A run whose commit went to
// a branch of its own (main had moved meanwhile) changed nothing on main,
// and the note says where its work is.
func (h *Handler) changes(ctx context.Context, account string, before map[string]string, beforeCut bool, run contract.Run) ([]changedFile, string, error) {
	var out struct {
		Branch   string `json:"branch"`
		GitError string `json:"gitError"`
	}
	_ = json.Unmarshal(run.Output, &out)
	switch {
	case out.GitError != "":
		return nil, "The run's work was not committed (" + out.GitError + "); the sandbox's snapshot keeps it.", nil
	case out.Branch == "":
		return nil, "The run committed nothing.", nil
	case out.Branch != "main":
		return nil, "main moved while the run ran, so its commit was pushed to branch " + out.Branch + " instead; the files it changed are on that branch.", nil
	}
	after, afterCut, err := h.blobs(ctx, account)
	if err != nil {
		return nil, "", err
	}
	if beforeCut || afterCut {
		return nil, "The repository is larger than the server lists, so the files the run changed are not listed; its commit is on main.", nil
	}
	return diffBlobs(before, after), "", nil
}

func diffBlobs(before, after map[string]string) []changedFile {
	changed := []changedFile{}
	for p, sha := range after {
		switch old, ok := before[p]; {
		case !ok:
			changed = append(changed, changedFile{p, "added"})
		case old != sha:
			changed = append(changed, changedFile{p, "modified"})
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			changed = append(changed, changedFile{p, "deleted"})
		}
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].Path < changed[j].Path })
	return changed
}

// execIn runs the command in a running sandbox, as the exec route does,
// with progress notifications while it runs.
func (h *Handler) execIn(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	id, err := requiredString(c.args, "sandbox_id")
	if err != nil {
		return nil, err
	}
	req, err := c.args.Exec()
	if err != nil {
		return nil, err
	}
	sb, err := h.sandbox(ctx, c.who, req.AccountID, id)
	if err != nil {
		return nil, err
	}
	stdout, stderr := capbuf.New(contract.MaxExecOutput), capbuf.New(contract.MaxExecOutput)
	start := time.Now()
	stop := h.tickProgress(ctx, c.req, func(elapsed time.Duration) string {
		return fmt.Sprintf("%s is running in %s after %s", req.Command, sb.ID, elapsed.Round(time.Second))
	})
	var res sandbox.ExecResult
	if node, ok := h.opts.Gate.Elsewhere(ctx, c.who, sb.ID); ok {
		res, err = h.execOn(ctx, node, c.who, sb.ID, req, stdout, stderr)
	} else {
		res, err = h.opts.Sandboxes.Exec(ctx, c.who.Principal, sb.ID, req.Domain(), stdout, stderr)
	}
	stop()
	if err != nil {
		return nil, edge.Explained(err, "Sandbox not found")
	}
	const cut = "not shown; run it with output to a file and read that"
	return execAnswer(contract.ExecResponse{
		Status: "success", ExitCode: res.ExitCode, OOMKilled: res.OOMKilled,
		Stdout: stdout.String(cut), Stderr: stderr.String(cut),
		DurationMs: time.Since(start).Milliseconds(),
	})
}

// tickProgress sends a progress notification every poll interval until
// the returned stop is called.
func (h *Handler) tickProgress(ctx context.Context, req *mcp.CallToolRequest, msg func(time.Duration) string) (stop func()) {
	notify := progress(req)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		start := time.Now()
		tick := time.NewTicker(h.opts.PollInterval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			elapsed := time.Since(start)
			if notify(ctx, elapsed.Seconds(), msg(elapsed)) != nil {
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func (h *Handler) getRun(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	requested, err := c.args.AccountID()
	if err != nil {
		return nil, err
	}
	if c.args.Has("run_id") {
		id, err := requiredString(c.args, "run_id")
		if err != nil {
			return nil, err
		}
		run, err := h.run(ctx, c.who, requested, id)
		if err != nil {
			return nil, err
		}
		return jsonResult(contract.RunsResponse{Status: "success", Runs: []contract.Run{contract.ViewRun(run, h.opts.Now())}})
	}
	limit := int64(20)
	if n, ok, err := c.args.Int("limit"); err != nil || (ok && (n < 1 || n > maxRunsListed)) {
		return nil, contract.FieldError(fmt.Sprintf("limit must be an integer between 1 and %d", maxRunsListed), "limit")
	} else if ok {
		limit = n
	}
	account, err := h.resolve(ctx, c.who, requested)
	if err != nil {
		return nil, err
	}
	runs, err := h.opts.Store.ListRuns(ctx, account, int(limit))
	if err != nil {
		return nil, fmt.Errorf("list runs of %s: %w", account, err)
	}
	resp := contract.RunsResponse{Status: "success", Runs: make([]contract.Run, 0, len(runs))}
	for _, run := range runs {
		resp.Runs = append(resp.Runs, contract.ViewRun(run, h.opts.Now()))
	}
	return jsonResult(resp)
}

func (h *Handler) stopSandbox(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	requested, err := c.args.AccountID()
	if err != nil {
		return nil, err
	}
	// On its host: here it would only be marked stopping and left to a
	// job on the host.
	return h.actOnSandbox(ctx, c, "stop", contract.AccountRequest{AccountID: requested}, func(p auth.Principal, id string) (store.Sandbox, error) {
		return h.opts.Sandboxes.Stop(ctx, p, id)
	})
}
