// Package agents owns the tasks that start sandboxes of their own: the
// account's setup (setup-sandbox: its README, its organizations'
// repositories as submodules, its first snapshot) and the coding agent
// (Claude Code on a clone of a repository, its change pushed to a branch
// and offered as a pull request). It drives sandboxes through Lifecycle,
// which the sandbox manager implements; scripts and agent CLIs live here,
// not in the lifecycle.
package agents

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/capbuf"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/escstrip"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// taskLifetime bounds the sandboxes the service starts for its own tasks.
const taskLifetime = 30 * time.Minute

// taskQuotaWait is how long a task waits, queued, for its account to have a
// free sandbox place before it fails with the quota's message.
const taskQuotaWait = 30 * time.Minute

// EnqueueTask records a run of task for account with payload, and its job,
// in one transaction. Tasks that start their own sandbox go to the default
// queue: any node may take them.
func EnqueueTask(ctx context.Context, st *store.Store, jc *jobs.Client, accountID, task string, payload any) (string, error) {
	return enqueueTask(ctx, st, jc, accountID, task, payload, 0)
}

// enqueueTask is EnqueueTask refusing (errdefs.ErrQuota) when the account
// already has limit queued or executing runs of task (0: no limit).
func enqueueTask(ctx context.Context, st *store.Store, jc *jobs.Client, accountID, task string, payload any, limit int) (string, error) {
	var runID string
	err := st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
		var err error
		runID, err = insertTaskRun(ctx, tx, q, jc, accountID, task, payload, limit)
		return err
	})
	return runID, err
}

// insertTaskRun records a run of task and inserts its job, in tx, refusing
// as enqueueTask does.
func insertTaskRun(ctx context.Context, tx *sql.Tx, q *store.Queries, jc *jobs.Client, accountID, task string, payload any, limit int) (string, error) {
	data, err := json.Marshal(payload)
	if err != nil {
		return "", fmt.Errorf("encode %s payload: %w", task, err)
	}
	run := store.Run{
		ID: store.NewID("run_"), AccountID: accountID, Task: task, Status: store.RunQueued,
		Payload: data, Tags: []string{"account:" + accountID},
	}
	var args river.JobArgs
	switch task {
	case jobs.KindSetupSandbox:
		args = jobs.SetupSandboxArgs{RunID: run.ID}
	case jobs.KindCodingAgent:
		args = jobs.CodingAgentArgs{RunID: run.ID}
	default:
		return "", fmt.Errorf("enqueue: unknown task %q", task)
	}
	if err := q.CreateRunWithin(ctx, &run, limit); err != nil {
		var qe *store.QuotaError
		if errors.As(err, &qe) {
			return "", errdefs.Newf(errdefs.ErrQuota, "account has %d queued or executing %s runs, the limit is %d; wait for one to finish", qe.Count, task, qe.Limit)
		}
		return "", fmt.Errorf("record %s run: %w", task, err)
	}
	return run.ID, jc.InsertTx(ctx, tx, args, "")
}

// EnqueueSetup starts the account's setup-sandbox run, or returns the id of
// the one already queued or executing (existing), so that two requests do
// not provision the account twice. The check and the insert share one
// transaction (serialised on SQLite); mu, when given, serialises callers of
// one process on PostgreSQL too.
func EnqueueSetup(ctx context.Context, st *store.Store, jc *jobs.Client, mu *sync.Mutex, accountID string) (runID string, existing bool, err error) {
	if mu != nil {
		mu.Lock()
		defer mu.Unlock()
	}
	err = st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
		if r, ok, err := activeSetup(ctx, q, accountID); err != nil || ok {
			runID, existing = r.ID, ok
			return err
		}
		var err error
		runID, err = insertTaskRun(ctx, tx, q, jc, accountID, jobs.KindSetupSandbox, map[string]any{"accountId": accountID}, 0)
		return err
	})
	if err != nil {
		return "", false, fmt.Errorf("enqueue setup of %s: %w", accountID, err)
	}
	return runID, existing, nil
}

// activeSetup returns the account's setup run that is queued or executing.
func activeSetup(ctx context.Context, q *store.Queries, accountID string) (store.Run, bool, error) {
	runs, err := q.ListRuns(ctx, accountID, 100)
	if err != nil {
		return store.Run{}, false, fmt.Errorf("list runs of %s: %w", accountID, err)
	}
	for _, r := range runs {
		if r.Task == jobs.KindSetupSandbox && (r.Status == store.RunQueued || r.Status == store.RunExecuting) {
			return r, true, nil
		}
	}
	return store.Run{}, false, nil
}

// Setup starts the account's setup-sandbox task (POST /api/sandboxes/setup),
// or returns the one already running.
func (s *Service) Setup(ctx context.Context, accountID string) (string, error) {
	runID, existing, err := s.setups.enqueue(ctx, accountID)
	if err != nil {
		return "", err
	}
	s.log.Info("setup requested", "account_id", accountID, "run_id", runID, "already_running", existing)
	return runID, nil
}

// Setups starts and watches the accounts' setup runs: what the sandbox
// manager needs of the setup task (sandbox.Setups). It needs only the
// database and the job queue, so the manager takes it when it is built,
// before the Service whose tasks drive sandboxes through the manager.
type Setups struct {
	st *store.Store
	jc *jobs.Client
	// mu serialises the check-then-enqueue of account setups.
	mu sync.Mutex
}

// NewSetups returns the Setups of st and jc; give the same one to the
// sandbox manager and to New, so that their enqueues take turns.
func NewSetups(st *store.Store, jc *jobs.Client) *Setups {
	return &Setups{st: st, jc: jc}
}

func (s *Setups) enqueue(ctx context.Context, accountID string) (string, bool, error) {
	return EnqueueSetup(ctx, s.st, s.jc, &s.mu, accountID)
}

// IfNew enqueues the account's setup when it has neither an environment
// nor a setup run yet (sandbox.Setups).
func (s *Setups) IfNew(ctx context.Context, accountID string) error {
	if _, err := s.st.GetEnvironment(ctx, accountID); err == nil || !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if _, ok, err := s.last(ctx, accountID); err != nil || ok {
		return err
	}
	_, _, err := s.enqueue(ctx, accountID)
	return err
}

// last returns the account's most recent setup run, if any.
func (s *Setups) last(ctx context.Context, accountID string) (store.Run, bool, error) {
	runs, err := s.st.ListRuns(ctx, accountID, 100)
	if err != nil {
		return store.Run{}, false, fmt.Errorf("list runs of %s: %w", accountID, err)
	}
	for _, r := range runs {
		if r.Task == jobs.KindSetupSandbox {
			return r, true, nil
		}
	}
	return store.Run{}, false, nil
}

// Pending reports whether the account's setup has yet to finish; runs wait
// for it so they start from the set-up repository (sandbox.Setups).
func (s *Setups) Pending(ctx context.Context, accountID string) bool {
	r, ok, err := s.last(ctx, accountID)
	return err == nil && ok && (r.Status == store.RunQueued || r.Status == store.RunExecuting)
}

type setupWorker struct {
	river.WorkerDefaults[jobs.SetupSandboxArgs]
	s *Service
}

func (w *setupWorker) Work(ctx context.Context, job *river.Job[jobs.SetupSandboxArgs]) error {
	return w.s.runTask(ctx, job.Args.RunID, w.s.setupAccount)
}

type codingAgentWorker struct {
	river.WorkerDefaults[jobs.CodingAgentArgs]
	s *Service
}

func (w *codingAgentWorker) Work(ctx context.Context, job *river.Job[jobs.CodingAgentArgs]) error {
	return w.s.runTask(ctx, job.Args.RunID, w.s.codingAgent)
}

// taskFunc does a task's work in a sandbox started for it and returns the
// run's output.
type taskFunc func(ctx context.Context, run store.Run, sb store.Sandbox, rsb runtime.Sandbox) (map[string]any, error)

// runTask runs a task that starts a sandbox of its own: only a QUEUED run
// starts; the sandbox is stopped at the end whatever happens.
func (s *Service) runTask(ctx context.Context, runID string, fn taskFunc) error {
	run, err := s.cfg.Store.GetRun(ctx, runID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load run %s: %w", runID, err)
	}
	if run.Status != store.RunQueued {
		// Delivered again after it started: nothing to wait for.
		return nil
	}
	// The task's sandbox counts against the account's quota; setup may go
	// one beyond it (the account's sandboxes wait for their setup).
	extra := 0
	if run.Task == jobs.KindSetupSandbox {
		extra = 1
	}
	if s.cfg.Lifecycle.AtQuota(ctx, run.AccountID, extra) && s.now().Sub(run.CreatedAt) < taskQuotaWait {
		// Wait queued, without holding a worker, for a place to free up.
		return river.JobSnooze(5 * time.Second)
	}
	if s.cfg.Node != nil && !s.cfg.Node.TakesSandboxes(ctx) {
		// This node of a cluster is cordoned or drained: the job goes
		// back to the shared queue for another node to take.
		return river.JobSnooze(time.Second)
	}
	started, err := s.cfg.Store.StartRun(ctx, run.ID, s.now())
	if err != nil || !started {
		return err
	}
	sb, rsb, err := s.cfg.Lifecycle.Launch(ctx, run.AccountID, run.Task, taskLifetime, extra, s.cfg.Network)
	if sb.ID != "" {
		// The run names its sandbox, as a command's run does: one that
		// failed to start says why there (failureReason).
		if _, lerr := s.cfg.Store.SetRunSandbox(ctx, run.ID, sb.ID); lerr != nil {
			s.log.Warn("record a task's sandbox", "run_id", run.ID, "sandbox_id", sb.ID, "err", lerr)
		}
	}
	if err != nil {
		return s.finishTask(ctx, run, nil, fmt.Errorf("start a sandbox: %w", err))
	}
	s.log.Info("task running", "run_id", run.ID, "task", run.Task, "sandbox_id", sb.ID)
	var out map[string]any
	err = s.cfg.Lifecycle.Prepare(ctx, sb, rsb, false)
	if err == nil {
		out, err = fn(ctx, run, sb, rsb)
	}
	if out == nil {
		out = map[string]any{}
	}
	out["sandboxId"] = sb.ID
	// The sandbox is stopped before the run says it ended.
	s.cfg.Lifecycle.StopQuietly(context.WithoutCancel(ctx), sb, run.Task+" finished")
	return s.finishTask(ctx, run, out, err)
}

func (s *Service) finishTask(ctx context.Context, run store.Run, out map[string]any, taskErr error) error {
	status, msg := store.RunCompleted, ""
	if taskErr != nil {
		// The run says what the user can act on; the rest (host paths,
		// internal errors) stays in the log.
		status, msg = store.RunFailed, errdefs.Message(taskErr, run.Task+" failed (details are in the server log)")
		s.log.Warn("task failed", "run_id", run.ID, "task", run.Task, "err", taskErr)
	}
	var output any
	if out != nil {
		output = out
	}
	return runs.Record(ctx, s.cfg.Store, run.ID, status, output, msg, s.now())
}

// sh runs a script in the sandbox with args as $1, $2, ..., failing with
// its last lines of stderr when it exits non-zero.
func sh(ctx context.Context, rsb runtime.Sandbox, cwd, script string, args ...string) (string, error) {
	stdout, stderr := capbuf.New(1<<20), capbuf.New(64<<10)
	res, err := rsb.Exec(ctx, runtime.ExecRequest{
		Cmd: append([]string{"/bin/sh", "-c", script, "sandboxd"}, args...), Cwd: cwd,
		Stdout: stdout, Stderr: stderr, Timeout: taskLifetime,
	})
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		// What the script said inside the sandbox is the user's to see.
		lines := strings.Split(strings.TrimSpace(stderr.String("")), "\n")
		how := fmt.Sprintf("exit status %d", res.ExitCode)
		if res.TimedOut {
			how = fmt.Sprintf("did not finish within %s", taskLifetime)
		}
		return stdout.String(""), errdefs.New(nil, how+": "+strings.Join(lines[max(0, len(lines)-5):], "\n"))
	}
	return stdout.String(""), nil
}

// setupScript writes the README, adds each organization's repository as a
// submodule at orgs/<slug> hard-reset to its latest main, commits and
// pushes. Arguments: sandbox id, account id, then slug and account id of
// each organization.
const setupScript = `set -e
cd /workspace
sandbox=$1 account=$2
shift 2
if [ ! -e README.md ]; then
  printf '# Sandbox workspace\n\n- Sandbox ID: %s\n- Account ID: %s\n' "$sandbox" "$account" > README.md
fi
while [ $# -ge 2 ]; do
  slug=$1 org=$2
  shift 2
  if [ ! -e "orgs/$slug/.git" ]; then
    git submodule add -q -f "../$org.git" "orgs/$slug"
  fi
  git -C "orgs/$slug" fetch -q origin
  if git -C "orgs/$slug" rev-parse -q --verify refs/remotes/origin/main >/dev/null; then
    git -C "orgs/$slug" reset -q --hard origin/main
  fi
  echo "org $slug $(git -C "orgs/$slug" rev-parse HEAD)"
done
git add -A
git diff --cached --quiet || git commit -q -m "Set up sandbox workspace"
git push -q origin HEAD:refs/heads/main
`

// setupAccount is the setup-sandbox task: the account's repository gets
// its README and its organizations as submodules, and the result becomes
// the account's snapshot.
func (s *Service) setupAccount(ctx context.Context, run store.Run, sb store.Sandbox, rsb runtime.Sandbox) (map[string]any, error) {
	if s.cfg.Persist == nil {
		return nil, errors.New("setup needs persistence (repositories and snapshots)")
	}
	orgs, err := s.cfg.Store.ListOrgsOf(ctx, run.AccountID)
	if err != nil {
		return nil, err
	}
	args := []string{sb.ID, run.AccountID}
	for _, o := range orgs {
		// An empty organization repository cannot be a submodule: give it
		// its first commit.
		if err := s.cfg.Persist.Initialize(ctx, o); err != nil {
			return nil, fmt.Errorf("initialise repository of %s: %w", o.Slug, err)
		}
		args = append(args, o.Slug, o.ID)
	}
	out, err := sh(ctx, rsb, "/workspace", setupScript, args...)
	result := map[string]any{"orgs": parseOrgs(out)}
	if err != nil {
		return result, fmt.Errorf("set up the workspace: %w", err)
	}
	snapID, err := s.cfg.Persist.Snapshot(ctx, sb, rsb)
	if err != nil {
		return result, err
	}
	s.cfg.Lifecycle.Prewarm(sb.AccountID)
	result["snapshotId"] = snapID
	return result, nil
}

func parseOrgs(out string) map[string]string {
	orgs := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "org" {
			orgs[f[1]] = f[2]
		}
	}
	return orgs
}

// codingAgentPayload is what a coding-agent run was asked.
type codingAgentPayload struct {
	RepoURL    string `json:"repo_url"`
	Prompt     string `json:"prompt"`
	BaseBranch string `json:"base_branch"`
	AccountID  string `json:"accountId"`
}

// CodingAgent queues a coding-agent task for the account.
func (s *Service) CodingAgent(ctx context.Context, accountID string, req sandbox.CodingAgentRequest) (string, error) {
	if err := s.cfg.Lifecycle.RequireCommand("claude", "a coding-agent run"); err != nil {
		return "", err
	}
	if err := s.cfg.Lifecycle.CheckRepoURL(accountID, req.RepoURL); err != nil {
		return "", fmt.Errorf("repo_url: %w", err)
	}
	return enqueueTask(ctx, s.cfg.Store, s.cfg.Jobs, accountID, jobs.KindCodingAgent, codingAgentPayload{
		RepoURL: req.RepoURL, Prompt: req.Prompt, BaseBranch: req.BaseBranch, AccountID: accountID,
	}, s.cfg.AgentRunsPerAccount)
}

// ralphOnceScript runs Claude Code once on the prompt ($1) in the current
// directory, as the original service's ralph-once.sh did.
const ralphOnceScript = `#!/bin/sh
# Written by sandboxd: run Claude Code once on a prompt.
# "--" ends the options: a prompt that starts with "-" is still the prompt.
exec claude --model opus --permission-mode acceptEdits -p -- "$1"
`

// RunClaudeCode writes ralph-once.sh into the sandbox and runs it in dir
// with the prompt as one argument, without a terminal (runs.NoTerminalEnv),
// streaming its output; running out of time is an error that says so
// (with the exit code of the kill).
func RunClaudeCode(ctx context.Context, rsb runtime.Sandbox, dir, prompt string, stdout, stderr io.Writer) (int, error) {
	if err := rsb.WriteFile(ctx, "/tmp/ralph-once.sh", strings.NewReader(ralphOnceScript), 0o755); err != nil {
		return 0, fmt.Errorf("write ralph-once.sh: %w", err)
	}
	res, err := rsb.Exec(ctx, runtime.ExecRequest{
		Cmd: []string{"/bin/sh", "/tmp/ralph-once.sh", prompt}, Cwd: dir, Env: runs.NoTerminalEnv,
		Stdout: stdout, Stderr: stderr, Timeout: taskLifetime,
	})
	if err != nil {
		return 0, fmt.Errorf("run claude: %w", err)
	}
	if res.TimedOut {
		return res.ExitCode, errdefs.Newf(nil, "claude did not finish within %s", taskLifetime)
	}
	return res.ExitCode, nil
}

// cloneScript clones $1 (with submodules) into $2 at the latest $3, and
// hard-resets the submodules to their latest main.
const cloneScript = `set -e
git clone -q --recurse-submodules "$1" "$2"
cd "$2"
git checkout -q -B "$3" "origin/$3"
git submodule -q foreach 'git fetch -q origin && git reset -q --hard origin/main || true'
`

// pushScript commits what the agent changed on branch $1 and pushes it,
// printing the diff stat; it prints nothing when nothing changed.
const pushScript = `set -e
[ -n "$(git status --porcelain)" ] || exit 0
git checkout -q -b "$1"
git add -A
git commit -q -m "$2"
git push -q origin "HEAD:refs/heads/$1"
git diff --stat HEAD~1 HEAD
`

// codingAgent is the coding-agent task: clone, run Claude Code, push the
// change on agent/<run id>.
func (s *Service) codingAgent(ctx context.Context, run store.Run, sb store.Sandbox, rsb runtime.Sandbox) (map[string]any, error) {
	var p codingAgentPayload
	if err := json.Unmarshal(run.Payload, &p); err != nil {
		return nil, fmt.Errorf("invalid payload: %w", err)
	}
	url := s.insideURL(p.RepoURL)
	// A repository on the forge is the account's own mirror (checked when
	// the task was accepted, and again here): the sandbox works on the
	// account's repository on sandboxd, which the mirror copies, and the
	// host pushes the result to the forge. The sandbox never holds a forge
	// credential.
	fm, hasMirror := s.cfg.Persist.(mirror)
	onForge := false
	if f := s.cfg.Forge; f != nil {
		_, onForge = f.ParseRepoURL(p.RepoURL)
	}
	if onForge {
		if err := s.cfg.Lifecycle.CheckRepoURL(run.AccountID, p.RepoURL); err != nil || !hasMirror {
			// The user's to act on: said in the run, not only in the log.
			return nil, errdefs.Newf(nil, "repository %s is not this account's mirror", p.RepoURL)
		}
		url = "http://sandboxd.internal/git/" + run.AccountID + ".git"
	}
	const dir = "/workspace/agent-repo"
	if _, err := sh(ctx, rsb, "/", cloneScript, url, dir, p.BaseBranch); err != nil {
		return nil, fmt.Errorf("clone %s at %s: %w", p.RepoURL, p.BaseBranch, err)
	}
	// The output is stored in the run: as text, as a command run's is.
	stdout, stderr := capbuf.New(runs.MaxOutput), capbuf.New(runs.MaxOutput)
	code, err := RunClaudeCode(ctx, rsb, dir, p.Prompt, escstrip.NewWriter(stdout), escstrip.NewWriter(stderr))
	out := map[string]any{"exitCode": code, "stdout": stdout.String("not kept"), "stderr": stderr.String("not kept")}
	if err != nil {
		return out, err
	}
	if code != 0 {
		return out, errdefs.New(nil, fmt.Sprintf("claude exited with status %d", code))
	}
	branch := "agent/" + run.ID
	title := strings.SplitN(strings.TrimSpace(p.Prompt), "\n", 2)[0]
	stat, err := sh(ctx, rsb, dir, pushScript, branch, "Agent: "+truncate(title, 72))
	if err != nil {
		return out, fmt.Errorf("push %s: %w", branch, err)
	}
	if strings.TrimSpace(stat) == "" {
		out["changed"] = false
		return out, nil
	}
	out["changed"], out["branch"], out["diffStat"] = true, branch, strings.TrimRight(stat, "\n")
	if f := s.cfg.Forge; f != nil && onForge {
		if r, err := fm.MirrorNow(ctx, run.AccountID); err != nil && r.FullName == "" {
			out["pullRequestError"] = "could not push to the mirror: " + s.forgeErrorText(ctx, run.ID, err)
		} else {
			pr, err := f.OpenPullRequest(ctx, r.FullName, forge.PullRequest{
				Head: branch, Base: p.BaseBranch, Title: "Agent: " + truncate(title, 72),
				Body: p.Prompt + "\n\nRun " + run.ID + " by sandboxd.\n\n```\n" + strings.TrimRight(stat, "\n") + "\n```\n",
			})
			if err != nil {
				out["pullRequestError"] = s.forgeErrorText(ctx, run.ID, err)
			} else {
				out["pullRequest"], out["pullRequestNumber"] = pr.HTMLURL, pr.Number
			}
		}
	}
	return out, nil
}

// forgeErrorText is what a run's output says of a failure to mirror or
// open a pull request. The forge's own refusals (its message, token
// redacted by package forge) are the user's to read; anything else (a host
// path, a git command's output on the host, a network error naming the
// operator's endpoints) stays in the server's log, and the run says where.
func (s *Service) forgeErrorText(ctx context.Context, runID string, err error) string {
	for _, refusal := range []error{forge.ErrNotFound, forge.ErrUnauthorized, forge.ErrForbidden, forge.ErrInvalid} {
		if errors.Is(err, refusal) {
			return err.Error()
		}
	}
	s.log.ErrorContext(ctx, "coding agent: mirror or pull request", "run_id", runID, "err", err)
	return "the forge could not be updated; the server's log has the details (run " + runID + ")"
}

// insideURL maps a repository URL of this server to the address sandboxes
// reach it at.
func (s *Service) insideURL(u string) string {
	if s.cfg.PublicURL != "" {
		if rest, ok := strings.CutPrefix(u, strings.TrimRight(s.cfg.PublicURL, "/")+"/git/"); ok {
			return "http://sandboxd.internal/git/" + rest
		}
	}
	return u
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Lifecycle is what the tasks need of the sandbox manager.
type Lifecycle interface {
	// Launch records and starts a sandbox for the account's task (named
	// as its runs name it); extra raises the account's quota for it.
	Launch(ctx context.Context, accountID, task string, lifetime time.Duration, extra int, policy netpol.Policy) (store.Sandbox, runtime.Sandbox, error)
	// Prepare readies the sandbox's /workspace.
	Prepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, again bool) error
	// StopQuietly stops a sandbox, logging a failure.
	StopQuietly(ctx context.Context, sb store.Sandbox, reason string)
	// AtQuota hints that the account has no free sandbox place.
	AtQuota(ctx context.Context, accountID string, extra int) bool
	// RequireCommand refuses (400) when the image lacks the CLI name.
	RequireCommand(name, what string) error
	// CheckRepoURL refuses (400) a repository the account may not name.
	CheckRepoURL(accountID, url string) error
	// Prewarm starts the account's next sandbox from its snapshot, just
	// taken, in the background.
	Prewarm(accountID string)
}

// Persistence is what the tasks need of internal/persist.
type Persistence interface {
	// Initialize gives an account's empty repository a first commit.
	Initialize(ctx context.Context, account store.Account) error
	// Snapshot captures the sandbox's filesystem as the account's snapshot.
	Snapshot(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) (string, error)
}

// mirror is a Persistence that mirrors repositories to the forge.
type mirror interface {
	MirrorNow(ctx context.Context, accountID string) (forge.Repo, error)
}

// Config builds a Service.
type Config struct {
	Store     *store.Store
	Jobs      *jobs.Client
	Lifecycle Lifecycle
	// Node says whether this node starts new sandboxes (a node of a
	// cluster that is cordoned or drained does not: membership.Membership);
	// nil: it always does, as a single node.
	Node interface {
		TakesSandboxes(ctx context.Context) bool
	}
	Persist Persistence // nil: setup fails, saying it needs persistence
	// Setups is the manager's view of the setup runs (NewSetups); nil: one
	// of Store and Jobs of its own.
	Setups *Setups
	// Forge, when configured, receives the coding agent's pull requests.
	Forge forge.Forge
	// PublicURL is this server's URL as clients know it; repository URLs
	// under it are rewritten to http://sandboxd.internal inside sandboxes.
	PublicURL string
	// Network is the policy of the tasks' sandboxes.
	Network netpol.Policy
	// AgentRunsPerAccount bounds the queued and executing coding-agent
	// runs of an account (0: unlimited).
	AgentRunsPerAccount int
	Logger              *slog.Logger
	Now                 func() time.Time
}

// Service serves the account setup and coding-agent tasks (the API's
// AgentService) and runs their jobs.
type Service struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	// setups enqueues the setup runs (Config.Setups).
	setups *Setups
}

// New returns a Service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Setups == nil {
		cfg.Setups = NewSetups(cfg.Store, cfg.Jobs)
	}
	return &Service{cfg: cfg, log: cfg.Logger, now: cfg.Now, setups: cfg.Setups}
}

// Register adds the tasks' job workers to w (before the job client starts).
func (s *Service) Register(w *river.Workers) {
	river.AddWorker(w, &setupWorker{s: s})
	river.AddWorker(w, &codingAgentWorker{s: s})
}
