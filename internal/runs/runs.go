// Package runs owns the run-sandbox-command task: a run and its job
// recorded in one transaction (Enqueue), the worker that executes the
// command once in its sandbox, the run's capped log and output, and what
// becomes of runs whose sandbox or server went away. It knows the
// sandboxes only through Host, which the sandbox manager implements.
package runs

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/capbuf"
	"github.com/sandboxd/sandboxd/internal/caplog"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/escstrip"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// MaxOutput bounds the stdout and stderr kept in a run's output; the
// whole stream goes to the run's log file in the data dir, itself capped
// to its head and tail (Config.LogMaxBytes). Both keep the output as
// text: terminal escape sequences are stripped (package escstrip).
const MaxOutput = 256 << 10

// NoTerminalEnv is added to the environment of every command a run or
// task starts: its output is kept as text, never shown on a terminal, so
// colours and cursor movement are asked off (NO_COLOR for most CLIs,
// FORCE_COLOR=0 for Node's chalk and supports-color, which the agent
// CLIs use; TERM=dumb for the rest). What a command prints regardless is
// stripped when stored.
var NoTerminalEnv = []string{"NO_COLOR=1", "FORCE_COLOR=0", "TERM=dumb"}

// runPayload is what a run-sandbox-command run was asked to do.
type runPayload struct {
	Command   string   `json:"command"`
	Args      []string `json:"args"`
	Cwd       string   `json:"cwd"`
	SandboxID string   `json:"sandboxId"`
	AccountID string   `json:"accountId"`
}

// runOutput is the output of a command run, in the shape of the task
// runner's result schema: stdout, stderr, exitCode and the snapshot taken
// after the command ({id, expiresAt}); the rest are sandboxd's additions.
type runOutput struct {
	Stdout     string       `json:"stdout"`
	Stderr     string       `json:"stderr"`
	ExitCode   int          `json:"exitCode"`
	Snapshot   *runSnapshot `json:"snapshot,omitempty"`
	SandboxID  string       `json:"sandboxId"`
	SnapshotID string       `json:"snapshotId,omitempty"`
	Branch     string       `json:"branch,omitempty"`
	GitError   string       `json:"gitError,omitempty"`
	// The run's log file (its whole output, on the server) was capped:
	// how many bytes were dropped between its head and tail, and a note
	// saying so in words.
	LogTruncated    bool   `json:"logTruncated,omitempty"`
	LogDroppedBytes int64  `json:"logDroppedBytes,omitempty"`
	LogNote         string `json:"logNote,omitempty"`
	// OOMKilled: the command (or a process of it) was killed because the
	// sandbox ran out of memory.
	OOMKilled bool `json:"oomKilled,omitempty"`
	// NetworkBytes is what the sandbox's network carried while the command
	// ran, for a sandbox with a network.
	NetworkBytes *networkBytes `json:"networkBytes,omitempty"`
}

// networkBytes counts IP bytes, headers included, as netpol does.
type networkBytes struct {
	Sent     uint64 `json:"sent"`
	Received uint64 `json:"received"`
}

// runSnapshot is the snapshot a run left, as the task runner reads it.
type runSnapshot struct {
	ID        string `json:"id"`
	ExpiresAt string `json:"expiresAt"`
}

func (o *runOutput) setSnapshot(id string, expiresAt time.Time) {
	if id == "" {
		return
	}
	o.SnapshotID = id
	o.Snapshot = &runSnapshot{ID: id, ExpiresAt: expiresAt.UTC().Format("2006-01-02T15:04:05.000Z")}
}

// timeoutMessage says that sb reached its deadline, and after how long.
func timeoutMessage(sb store.Sandbox) string {
	lifetime := sb.Deadline.Sub(sb.CreatedAt).Round(time.Millisecond)
	return fmt.Sprintf("the sandbox reached its timeout after %s (at %s)", lifetime, sb.Deadline.UTC().Format(time.RFC3339))
}

type runCommandWorker struct {
	river.WorkerDefaults[jobs.RunCommandArgs]
	r *Runner
}

// Work runs the command of a run once. The run row decides: only a QUEUED
// run is started, so a job handed out again after a crash never runs its
// command twice. Errors are recorded in the run, not returned to River,
// except failures before the command started, which are safe to retry.
func (w *runCommandWorker) Work(ctx context.Context, job *river.Job[jobs.RunCommandArgs]) error {
	return w.r.Run(ctx, job.Args.RunID)
}

// Run executes the command of run runID once, if it is still QUEUED.
func (r *Runner) Run(ctx context.Context, runID string) error {
	run, err := r.cfg.Store.GetRun(ctx, runID)
	if errors.Is(err, store.ErrNotFound) {
		r.log.Warn("job for unknown run", "run_id", runID)
		return nil
	}
	if err != nil {
		return fmt.Errorf("load run %s: %w", runID, err)
	}
	if run.Status != store.RunQueued {
		return nil
	}
	var p runPayload
	if err := json.Unmarshal(run.Payload, &p); err != nil || p.Command == "" {
		return r.Finish(ctx, run, store.RunFailed, nil, fmt.Sprintf("invalid run payload: %v", err))
	}
	sb, err := r.cfg.Store.GetSandbox(ctx, run.SandboxID)
	if err != nil {
		return fmt.Errorf("load sandbox of run %s: %w", runID, err)
	}
	if sb.Status != store.SandboxRunning {
		if sb.FailureReason == store.ReasonTimeout {
			return r.Finish(ctx, run, store.RunFailed, nil, timeoutMessage(sb)+" before the command could start")
		}
		return r.Finish(ctx, run, store.RunFailed, nil, fmt.Sprintf("sandbox %s is %s before the command could start", sb.ID, sb.Status))
	}
	rsb, err := r.cfg.Host.Local(ctx, sb)
	if err != nil {
		r.log.Error("run: sandbox not reachable", "run_id", run.ID, "sandbox_id", sb.ID, "err", err)
		return r.Finish(ctx, run, store.RunFailed, nil, fmt.Sprintf("sandbox %s is not reachable", sb.ID))
	}
	if r.cfg.Host.SetupPending(ctx, run.AccountID) {
		// Start from the set-up repository: wait for the account's setup.
		return river.JobSnooze(time.Second)
	}
	started, err := r.cfg.Store.StartRun(ctx, run.ID, r.now())
	if err != nil {
		return fmt.Errorf("start run %s: %w", runID, err)
	}
	if !started {
		return nil
	}
	r.log.Info("run executing", "run_id", run.ID, "sandbox_id", sb.ID, "command", p.Command)

	logFile, err := r.openLog(run.ID)
	if err != nil {
		return r.Finish(ctx, run, store.RunFailed, nil, "could not open the run log")
	}
	defer logFile.Close()
	stdout, stderr := capbuf.New(MaxOutput), capbuf.New(MaxOutput)
	// Again, not once: what was pushed since the sandbox started (by the
	// account's setup, say) is fetched and fast-forwarded.
	if err := r.cfg.Host.Prepare(ctx, sb, rsb, true); err != nil {
		// The run's stderr says what the sandbox's git said, never the
		// host's error (its paths stay in the log).
		r.log.Warn("prepare workspace for run", "run_id", run.ID, "err", err)
		fmt.Fprintf(io.MultiWriter(stderr, logFile.stream("stderr")), "sandboxd: preparing /workspace failed: %s\n", errdefs.Message(err, "details are in the server log"))
	}
	// A run that names no directory runs in the sandbox's default one:
	// /workspace, or its template's WORKDIR; as its template's USER.
	dcwd, user, err := r.cfg.Host.ExecDefaults(ctx, sb)
	if err != nil {
		r.log.Warn("the defaults of a template's commands", "run_id", run.ID, "err", err)
	}
	cwd := cmp.Or(p.Cwd, dcwd)
	if p.Command == "opencode" {
		if err := r.writeOpenCodeConfig(ctx, rsb, cmp.Or(cwd, "/workspace")); err != nil {
			fmt.Fprintf(io.MultiWriter(stderr, logFile.stream("stderr")), "sandboxd: writing opencode.json failed: %v\n", err)
		}
	}
	trafficBefore := r.traffic(ctx, sb)
	// The run lasts as long as the sandbox does: its deadline (which may be
	// extended meanwhile) is the reaper's to enforce, by stopping it. The
	// command is the agent's, tagged with the run: a server that stops
	// leaves it running (Detach) and follows it again when it starts
	// (Reconcile, resume).
	res, execErr := rsb.Exec(ctx, runtime.ExecRequest{
		Cmd:    append([]string{p.Command}, p.Args...),
		Env:    NoTerminalEnv,
		Cwd:    cwd,
		User:   user,
		Tag:    run.ID,
		Detach: true,
		Stdout: io.MultiWriter(escstrip.NewWriter(stdout), logFile.output(streamStdout)),
		Stderr: io.MultiWriter(escstrip.NewWriter(stderr), logFile.output(streamStderr)),
	})
	return r.complete(ctx, run, sb, rsb, p, res, execErr, stdout, stderr, logFile, trafficBefore)
}

// complete records how a run's command ended, once it has: its output,
// what became of its sandbox, and the work it left.
func (r *Runner) complete(ctx context.Context, run store.Run, sb store.Sandbox, rsb runtime.Sandbox, p runPayload, res runtime.ExecResult, execErr error,
	stdout, stderr *capbuf.Buffer, logFile *runLog, trafficBefore *netpol.Traffic) error {
	if execErr != nil && ctx.Err() != nil {
		// This server is stopping, not the command: it runs on in its
		// sandbox, and the next start follows it again (Reconcile).
		r.log.Info("run left running for the next start", "run_id", run.ID, "sandbox_id", sb.ID)
		return ctx.Err()
	}
	where := "in the run log"
	if logFile.Dropped() > 0 {
		where = "not kept (the run log keeps only its head and tail)"
	}
	out := runOutput{Stdout: stdout.String(where), Stderr: stderr.String(where), SandboxID: sb.ID, ExitCode: res.ExitCode, OOMKilled: res.OOMKilled}
	if after := r.traffic(ctx, sb); trafficBefore != nil && after != nil {
		out.NetworkBytes = &networkBytes{Sent: after.TxBytes - trafficBefore.TxBytes, Received: after.RxBytes - trafficBefore.RxBytes}
	}
	if d := logFile.Dropped(); d > 0 {
		out.LogTruncated, out.LogDroppedBytes = true, d
		out.LogNote = "the output was longer than the run log keeps: " + logFile.Note()
		r.log.Warn("run log capped", "run_id", run.ID, "dropped_bytes", d)
	}
	if errors.Is(execErr, runtime.ErrCommandNotFound) {
		out.ExitCode = 127
		return r.Finish(ctx, run, store.RunFailed, &out, fmt.Sprintf("command not found: %s", p.Command))
	}
	// Whether the command ended by itself or because its sandbox went away
	// (a stop kills it, reported as an error or as a signal's exit code),
	// the sandbox's state tells.
	current, err := r.cfg.Store.GetSandbox(context.WithoutCancel(ctx), sb.ID)
	if err != nil {
		return fmt.Errorf("reload sandbox %s: %w", sb.ID, err)
	}
	if current.Status != store.SandboxRunning {
		if current.FailureReason == store.ReasonTimeout {
			// FAILED, not a status of our own: the published enum has no
			// timeout, and clients poll statuses they do not know forever.
			return r.Finish(ctx, run, store.RunFailed, &out, timeoutMessage(current)+" while the command ran; the output up to then is kept")
		}
		return r.Finish(ctx, run, store.RunFailed, &out, fmt.Sprintf("the sandbox was %s while the command ran (%s)", current.Status, current.FailureReason))
	}
	if execErr != nil {
		r.log.Error("run exec", "run_id", run.ID, "err", execErr)
		return r.Finish(ctx, run, store.RunCrashed, &out, "the command could not be run to completion: "+errdefs.Message(execErr, "the sandbox's agent failed (details are in the server log)"))
	}
	if r.cfg.Persist != nil {
		saved, err := r.cfg.Persist.AfterRun(ctx, sb, rsb, run)
		out.Branch, out.GitError = saved.Branch, saved.GitError
		if err != nil {
			r.log.Error("persist run", "run_id", run.ID, "err", err)
			return r.Finish(ctx, run, store.RunFailed, &out, "the command finished but its work could not be saved: "+errdefs.Message(err, "internal error (details are in the server log)"))
		}
		out.setSnapshot(saved.SnapshotID, saved.SnapshotExpiresAt)
	}
	return r.Finish(ctx, run, store.RunCompleted, &out, "")
}

// Finish records a run's end. A command that ran to its end is
// COMPLETED whatever its exit code: the exit code is in the output.
func (r *Runner) Finish(ctx context.Context, run store.Run, status store.RunStatus, out *runOutput, errMsg string) error {
	var output any
	if out != nil {
		output = out
	}
	if err := Record(ctx, r.cfg.Store, run.ID, status, output, errMsg, r.now()); err != nil {
		return err
	}
	r.log.Info("run finished", "run_id", run.ID, "status", status)
	r.pruneLogs(context.WithoutCancel(ctx), run.AccountID)
	r.pruneRecords(context.WithoutCancel(ctx), run.AccountID)
	return nil
}

// KeptRunLogs is how many of an account's newest runs keep their log in
// DATA_DIR/runs. Each log is capped (LogMaxBytes), but an account starts
// runs without end: without a bound on their number, one account's runs
// would fill the host's data directory one capped log at a time. The logs
// of its older runs go when one of its runs ends.
const KeptRunLogs = 8

// pruneWindow is how many runs past the kept ones an end looks at: the logs
// of those before them went at earlier ends. (A run that ends after more
// than this many newer ones of its account keeps its log.)
const pruneWindow = 1024

// KeptRunRecords is how many of an account's newest runs keep their record
// (the row GET /api/tasks/runs answers, its output up to 512 KiB): older
// finished ones are deleted when one of its runs ends, so one account's
// runs cannot grow the database without end either.
const KeptRunRecords = 500

// pruneRecords deletes the records of accountID's finished runs past its
// newest Config.KeptRecords runs.
func (r *Runner) pruneRecords(ctx context.Context, accountID string) {
	ids, err := r.cfg.Store.FinishedRunsPast(ctx, accountID, r.cfg.KeptRecords, pruneWindow)
	if err == nil {
		_, err = r.cfg.Store.DeleteFinishedRuns(ctx, ids)
	}
	if err != nil {
		r.log.Warn("prune run records", "account_id", accountID, "err", err)
	}
}

// pruneLogs deletes the logs of accountID's finished runs past its newest
// KeptRunLogs runs.
func (r *Runner) pruneLogs(ctx context.Context, accountID string) {
	ids, err := r.cfg.Store.FinishedRunsPast(ctx, accountID, KeptRunLogs, pruneWindow)
	if err != nil {
		r.log.Warn("prune run logs", "account_id", accountID, "err", err)
		return
	}
	logs := Logs{DataDir: r.cfg.DataDir}
	for _, id := range ids {
		if err := logs.Remove(id); err != nil {
			r.log.Warn("prune run log", "run_id", id, "err", err)
		}
	}
}

// Record writes the end of run runID, of any task: its status, its output
// (out as JSON; nil: none) and its error message ("": none), the shape the
// runs API answers.
func Record(ctx context.Context, st *store.Store, runID string, status store.RunStatus, out any, errMsg string, now time.Time) error {
	var output, errJSON json.RawMessage
	if out != nil {
		b, err := json.Marshal(out)
		if err != nil {
			return fmt.Errorf("encode output of %s: %w", runID, err)
		}
		output = b
	}
	if errMsg != "" {
		errJSON, _ = json.Marshal(map[string]string{"message": errMsg})
	}
	if _, err := st.FinishRun(context.WithoutCancel(ctx), runID, status, output, errJSON, now); err != nil {
		return fmt.Errorf("record end of run %s: %w", runID, err)
	}
	return nil
}

// openLog opens a run's log, capped: the command's output comes from
// the sandbox and may be endless. A log that exists already (a run
// followed again after a restart) is continued.
func (r *Runner) openLog(runID string) (*runLog, error) {
	path := LogPath(r.cfg.DataDir, runID)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	open := endsOpen(path)
	w, err := caplog.Open(path, r.cfg.LogMaxBytes)
	if err != nil {
		return nil, err
	}
	l := &runLog{Writer: w, posPath: path + ".pos"}
	l.pos = readPos(l.posPath)
	if open {
		l.open = "?" // whose line it is is not known: the next one starts anew
	}
	return l, nil
}

// writeOpenCodeConfig points OpenCode at the configured model provider
// through the model proxy by writing opencode.json in dir, unless the
// repository has its own. The file names only the proxy and the variable
// holding the sandbox's own key (RECOUP_API_KEY): the provider's real key
// never enters the sandbox. A file sandboxd wrote before (committed with
// the workspace, naming the provider directly) is rewritten.
func (r *Runner) writeOpenCodeConfig(ctx context.Context, rsb runtime.Sandbox, dir string) error {
	mp := r.cfg.Model
	if mp.BaseURL == "" || mp.Model == "" {
		return nil
	}
	path := strings.TrimRight(dir, "/") + "/opencode.json"
	const proxied = modelproxy.SandboxURL + "openai"
	if rc, err := rsb.ReadFile(ctx, path); err == nil {
		// Bounded: the file comes from the sandbox.
		data, _ := io.ReadAll(io.LimitReader(rc, 1<<20))
		rc.Close()
		var old struct {
			Provider map[string]struct {
				Name    string `json:"name"`
				Options struct {
					BaseURL string `json:"baseURL"`
				} `json:"options"`
			} `json:"provider"`
		}
		if json.Unmarshal(data, &old) != nil {
			return nil
		}
		p, ours := old.Provider["sandboxd"]
		if !ours || p.Name != "sandboxd" || p.Options.BaseURL == proxied {
			return nil
		}
	}
	cfg := map[string]any{
		"provider": map[string]any{
			"sandboxd": map[string]any{
				"npm":     "@ai-sdk/openai-compatible",
				"name":    "sandboxd",
				"options": map[string]any{"baseURL": proxied, "apiKey": "{env:RECOUP_API_KEY}"},
				"models":  map[string]any{mp.Model: map[string]any{}},
			},
		},
		"model": "sandboxd/" + mp.Model,
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return rsb.WriteFile(ctx, path, bytes.NewReader(append(data, '\n')), 0o644)
}

// Saved is what AfterRun kept of a run's work.
type Saved struct {
	SnapshotID string // the snapshot now the account's
	// SnapshotExpiresAt is when the account's snapshot row expires.
	SnapshotExpiresAt time.Time
	Branch            string // where the commit was pushed: main, or sandbox/<id> when main had moved
	GitError          string // why commit or push failed, if they did (the snapshot still has the work)
}

// Host is what runs need of the sandbox manager.
type Host interface {
	// Local is the runtime sandbox of a running sandbox of this node
	// (errdefs.ErrNotRunning otherwise).
	Local(ctx context.Context, sb store.Sandbox) (runtime.Sandbox, error)
	// Prepare readies /workspace; again fetches what was pushed since.
	Prepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, again bool) error
	// SetupPending says the account's setup task is queued or executing:
	// a run waits for it, to start from the set-up repository.
	SetupPending(ctx context.Context, accountID string) bool
	// TrafficOf is what the sandbox's network carried so far; nil without
	// a network.
	TrafficOf(ctx context.Context, sb store.Sandbox) (*netpol.Traffic, error)
	// ExecDefaults are the directory and user of a command that names
	// none ("": the agent's, /workspace and root): a template's WORKDIR
	// and USER.
	ExecDefaults(ctx context.Context, sb store.Sandbox) (cwd, user string, err error)
}

// traffic reads the sandbox's network counters; nil without a network or
// when they cannot be read (logged: the run goes on without them).
func (r *Runner) traffic(ctx context.Context, sb store.Sandbox) *netpol.Traffic {
	tr, err := r.cfg.Host.TrafficOf(ctx, sb)
	if err != nil {
		r.log.Warn("read sandbox traffic", "sandbox_id", sb.ID, "err", err)
		return nil
	}
	return tr
}

// AfterRunner persists the work of a run (internal/persist).
type AfterRunner interface {
	AfterRun(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, run store.Run) (Saved, error)
}

// ModelProvider is an OpenAI-compatible model API, which sandboxes reach
// only through the model proxy (modelproxy.SandboxURL + "openai"); its key
// stays on the host.
type ModelProvider struct {
	BaseURL string // the real API; "" when none is configured
	Model   string
}

// Config builds a Runner.
type Config struct {
	Store   *store.Store
	Jobs    *jobs.Client
	Host    Host
	Persist AfterRunner // nil: runs keep nothing
	NodeID  string
	DataDir string // run logs are under DataDir/runs
	// KeptRecords is how many of an account's newest runs keep their
	// record (0: KeptRunRecords).
	KeptRecords int
	// LogMaxBytes caps each run's log file (head and tail are kept);
	// 0: caplog.DefaultSize.
	LogMaxBytes int64
	// Model is the provider prompts (opencode) are pointed at.
	Model  ModelProvider
	Logger *slog.Logger
	Now    func() time.Time
}

// Runner executes runs on one node.
type Runner struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
}

// New returns a Runner.
func New(cfg Config) *Runner {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KeptRecords <= 0 {
		cfg.KeptRecords = KeptRunRecords
	}
	return &Runner{cfg: cfg, log: cfg.Logger, now: cfg.Now}
}

// Register adds the run worker to w (before the job client starts).
func (r *Runner) Register(w *river.Workers) {
	river.AddWorker(w, &runCommandWorker{r: r})
}

// LogPath is where the full output of run runID is kept.
func LogPath(dataDir, runID string) string {
	return filepath.Join(dataDir, "runs", runID+".log")
}

// Logs are the run logs this node keeps (DATA_DIR/runs): opened for the
// API's log stream (GET /api/tasks/runs/{id}/log), listed and removed by
// the retention sweep.
type Logs struct{ DataDir string }

// OpenRunLog opens run id's log to read; an error wrapping fs.ErrNotExist
// when there is none.
func (l Logs) OpenRunLog(id string) (*os.File, error) {
	if !validRunID(id) {
		return nil, fmt.Errorf("open log of run %q: %w", id, fs.ErrNotExist)
	}
	f, err := os.Open(LogPath(l.DataDir, id))
	if err != nil {
		return nil, fmt.Errorf("open log of run %s: %w", id, err)
	}
	return f, nil
}

// Enqueue records a run of command in sandbox sb and its job in one
// transaction: an acknowledged run always has its job.
func Enqueue(ctx context.Context, st *store.Store, jc *jobs.Client, sb store.Sandbox, command string, args []string, cwd string, now time.Time) (string, error) {
	if args == nil {
		args = []string{}
	}
	payload, err := json.Marshal(runPayload{Command: command, Args: args, Cwd: cwd, SandboxID: sb.ID, AccountID: sb.AccountID})
	if err != nil {
		return "", fmt.Errorf("encode run payload: %w", err)
	}
	run := store.Run{
		ID: store.NewID("run_"), AccountID: sb.AccountID, SandboxID: sb.ID,
		Task: jobs.KindRunCommand, Status: store.RunQueued, Payload: payload,
		Tags:      []string{"account:" + sb.AccountID, "sandbox:" + sb.ID},
		CreatedAt: now, UpdatedAt: now,
	}
	err = st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
		if err := q.CreateRun(ctx, &run); err != nil {
			return fmt.Errorf("record run: %w", err)
		}
		return jc.InsertTx(ctx, tx, jobs.RunCommandArgs{RunID: run.ID}, sb.NodeID)
	})
	if err != nil {
		return "", err
	}
	return run.ID, nil
}

// Reconcile takes up the runs of this node that were executing when the
// server stopped: a run whose sandbox still runs is followed again (its
// command ran on in the sandbox; resume), one whose sandbox is gone is
// CRASHED. Queued runs are left alone: their jobs are still in the queue
// and run when the workers start (and fail cleanly if their sandbox is
// gone). ctx bounds the resumed runs: when it ends they are left running
// again for the next start.
func (r *Runner) Reconcile(ctx context.Context) error {
	runs, err := r.cfg.Store.ListRunsByStatus(ctx, store.RunExecuting)
	if err != nil {
		return fmt.Errorf("list executing runs: %w", err)
	}
	for _, run := range runs {
		if run.Task != jobs.KindRunCommand {
			// A task's run names its sandbox too, but the task is not
			// this runner's to follow.
			continue
		}
		sb, err := r.cfg.Store.GetSandbox(ctx, run.SandboxID)
		if err != nil || sb.NodeID != r.cfg.NodeID {
			continue
		}
		if sb.Status == store.SandboxRunning {
			go func() {
				if err := r.resume(ctx, run, sb); err != nil && ctx.Err() == nil {
					r.log.Error("resume run", "run_id", run.ID, "err", err)
				}
			}()
			continue
		}
		if err := r.Finish(ctx, run, store.RunCrashed, nil, "sandboxd restarted while the command was executing, and its sandbox is gone"); err != nil {
			return err
		}
	}
	return nil
}

// CrashRunsOf finishes the executing runs of the sandboxes named in gone
// as CRASHED with reason: their sandboxes were lost with their node, and
// nobody follows their commands any more. Their queued runs are failed
// by the workers that take their jobs.
func (r *Runner) CrashRunsOf(ctx context.Context, gone map[string]bool, reason string) error {
	if len(gone) == 0 {
		return nil
	}
	runs, err := r.cfg.Store.ListRunsByStatus(ctx, store.RunExecuting)
	if err != nil {
		return fmt.Errorf("list executing runs: %w", err)
	}
	var errs []error
	for _, run := range runs {
		if gone[run.SandboxID] {
			errs = append(errs, r.Finish(ctx, run, store.RunCrashed, nil, reason))
		}
	}
	return errors.Join(errs...)
}

// resume follows the command of a run that was executing when the server
// stopped: the agent kept it running and the tail of its output, so the
// run gets the output it missed (what the log lacks is appended) and ends
// as if the server had never gone. CRASHED is for a command that is
// really gone (its sandbox's agent restarted).
func (r *Runner) resume(ctx context.Context, run store.Run, sb store.Sandbox) error {
	var p runPayload
	if err := json.Unmarshal(run.Payload, &p); err != nil {
		return r.Finish(ctx, run, store.RunFailed, nil, fmt.Sprintf("invalid run payload: %v", err))
	}
	rsb, err := r.cfg.Host.Local(ctx, sb)
	if err != nil {
		return r.Finish(ctx, run, store.RunCrashed, nil, "sandboxd restarted while the command was executing, and its sandbox could not be reached")
	}
	logFile, err := r.openLog(run.ID)
	if err != nil {
		return r.Finish(ctx, run, store.RunCrashed, nil, "sandboxd restarted while the command was executing, and its run log could not be opened")
	}
	defer logFile.Close()
	r.log.Info("run followed again after a restart", "run_id", run.ID, "sandbox_id", sb.ID)
	stdout, stderr := capbuf.New(MaxOutput), capbuf.New(MaxOutput)
	res, execErr := rsb.Attach(ctx, runtime.AttachRequest{
		Tag: run.ID, Detach: true,
		Stdout:  io.MultiWriter(escstrip.NewWriter(stdout), logFile.output(streamStdout)),
		Stderr:  io.MultiWriter(escstrip.NewWriter(stderr), logFile.output(streamStderr)),
		Started: func(_ int, from runtime.StreamOffsets) { logFile.resumeAt(from) },
	})
	if errors.Is(execErr, fs.ErrNotExist) {
		return r.Finish(ctx, run, store.RunCrashed, nil, "sandboxd restarted while the command was executing, and the command is gone (its sandbox's agent restarted)")
	}
	return r.complete(ctx, run, sb, rsb, p, res, execErr, stdout, stderr, logFile, nil)
}
