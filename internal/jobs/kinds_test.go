package jobs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/agents"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/persist/persisttest"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// These tests work each job kind end to end in one process, as serve wires
// it: River on SQLite with every worker registered (the sandbox manager's
// run-sandbox-command and stop-sandbox, the agents' setup-sandbox and
// coding-agent), the real manager and persistence (repositories, blobs,
// snapshots), and the in-memory sandboxes of runtimefake, whose processes
// are scripted by what they run. A job goes in through the path that
// enqueues it in production; the run's and the sandbox's rows come out.

// node is one serving node: its job client works its queues.
type node struct {
	st      *store.Store
	jc      *jobs.Client
	rt      *runtimefake.Runtime
	mgr     *sandbox.Manager
	agents  *agents.Service
	account store.Account

	mu      sync.Mutex
	execs   map[string]int // by command (or script kind)
	scripts map[string]func(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error)
}

func newNode(t *testing.T) *node {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	workers := river.NewWorkers()
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here", Workers: workers, Concurrency: 4})
	if err != nil {
		t.Fatal(err)
	}
	p := persisttest.New(t, st, persist.Options{})
	n := &node{st: st, jc: jc, rt: runtimefake.New(), execs: map[string]int{}, scripts: map[string]func(context.Context, *runtimefake.Sandbox, runtime.ExecRequest) (runtime.ExecResult, error){}}
	n.rt.SetExec(n.exec)
	setups := agents.NewSetups(st, jc)
	n.mgr = sandbox.NewManager(sandbox.Config{Store: st, Runtime: n.rt, Jobs: jc, NodeID: "here", DataDir: t.TempDir(), Persist: p,
		Hooks: append([]sandbox.Hook{sandbox.NewKeyHook(sandbox.KeyHookConfig{Store: st})}, p.Hooks()...), Setups: setups})
	n.agents = agents.New(agents.Config{Store: st, Jobs: jc, Lifecycle: n.mgr, Persist: p, Setups: setups})
	n.mgr.RegisterWorkers(workers)
	n.agents.Register(workers)
	if err := jc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := jc.Stop(stopCtx); err != nil {
			t.Errorf("stop the job client: %v", err)
		}
	})
	n.account = store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &n.account); err != nil {
		t.Fatal(err)
	}
	return n
}

// kindOf names a process: the agents' and persistence's scripts by what
// they do, Claude Code by its wrapper, anything else by its command.
func kindOf(cmd []string) string {
	if len(cmd) >= 3 && cmd[0] == "/bin/sh" && cmd[1] == "-c" {
		switch s := cmd[2]; {
		case strings.Contains(s, "git submodule add"):
			return "setup"
		case strings.Contains(s, "git clone -q --recurse-submodules"):
			return "clone"
		case strings.Contains(s, `git checkout -q -b "$1"`):
			return "push"
		default:
			return "persist" // preparing /workspace, saving a run's work
		}
	}
	if len(cmd) >= 2 && cmd[0] == "/bin/sh" && cmd[1] == "/tmp/ralph-once.sh" {
		return "claude"
	}
	return cmd[0]
}

func (n *node) exec(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
	kind := kindOf(req.Cmd)
	n.mu.Lock()
	n.execs[kind]++
	fn := n.scripts[kind]
	n.mu.Unlock()
	if fn == nil {
		return runtime.ExecResult{}, nil
	}
	return fn(ctx, sb, req)
}

func (n *node) script(kind string, fn func(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.scripts[kind] = fn
}

func (n *node) execCount(kind string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.execs[kind]
}

// eventually polls cond until it holds, failing the test if it never does.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// jobRow is a River job as its table holds it.
type jobRow struct {
	ID      int64
	State   string
	Attempt int
	Errors  string
	Args    string
}

func (n *node) jobs(t *testing.T, kind string) []jobRow {
	t.Helper()
	rows, err := n.st.DB().QueryContext(context.Background(), `SELECT id, state, attempt, COALESCE(errors, ''), args FROM river_job WHERE kind = ? ORDER BY id`, kind)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []jobRow
	for rows.Next() {
		var j jobRow
		if err := rows.Scan(&j.ID, &j.State, &j.Attempt, &j.Errors, &j.Args); err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// worked waits until River has finished every job of kind, and checks
// that each completed at its first attempt: the workers record a task's
// failure in its run, not as a job error River would retry.
func (n *node) worked(t *testing.T, kind string, count int) {
	t.Helper()
	var js []jobRow
	eventually(t, fmt.Sprintf("%d %s jobs finished", count, kind), func() bool {
		js = n.jobs(t, kind)
		if len(js) != count {
			return false
		}
		for _, j := range js {
			if j.State != "completed" && j.State != "discarded" && j.State != "retryable" && j.State != "cancelled" {
				return false
			}
		}
		return true
	})
	for _, j := range js {
		if j.State != "completed" || j.Attempt != 1 {
			t.Fatalf("%s job %d is %s after %d attempts (errors %s), want completed at the first", kind, j.ID, j.State, j.Attempt, j.Errors)
		}
	}
}

// final waits for run runID to reach a final status and returns it with
// its decoded output and error message.
func (n *node) final(t *testing.T, runID string) (store.Run, map[string]any, string) {
	t.Helper()
	var run store.Run
	eventually(t, "run "+runID+" finished", func() bool {
		var err error
		run, err = n.st.GetRun(context.Background(), runID)
		if err != nil {
			t.Fatal(err)
		}
		return run.Status != store.RunQueued && run.Status != store.RunExecuting
	})
	var out map[string]any
	if len(run.Output) > 0 {
		if err := json.Unmarshal(run.Output, &out); err != nil {
			t.Fatalf("output %s: %v", run.Output, err)
		}
	}
	var e struct{ Message string }
	_ = json.Unmarshal(run.Error, &e)
	return run, out, e.Message
}

func (n *node) sandboxRow(t *testing.T, id string) store.Sandbox {
	t.Helper()
	sb, err := n.st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func TestRunCommandJob(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	n.script("exit3", func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		fmt.Fprintf(req.Stdout, "args %v", req.Cmd[1:])
		fmt.Fprint(req.Stderr, "oops")
		return runtime.ExecResult{ExitCode: 3}, nil
	})
	n.script("missing", func(context.Context, *runtimefake.Sandbox, runtime.ExecRequest) (runtime.ExecResult, error) {
		return runtime.ExecResult{ExitCode: 127}, runtime.ErrCommandNotFound
	})
	n.script("agentdies", func(context.Context, *runtimefake.Sandbox, runtime.ExecRequest) (runtime.ExecResult, error) {
		return runtime.ExecResult{}, io.ErrUnexpectedEOF
	})
	jobsSoFar := 0
	run := func(t *testing.T, command string) (store.Sandbox, store.Run, map[string]any, string) {
		t.Helper()
		sb, runID, err := n.mgr.Create(ctx, n.account.ID, sandbox.CreateRequest{Command: command, Args: []string{"a b", "c"}})
		if err != nil || runID == "" {
			t.Fatalf("create with %s: %v %q", command, err, runID)
		}
		jobsSoFar++
		r, out, msg := n.final(t, runID)
		n.worked(t, jobs.KindRunCommand, jobsSoFar)
		return sb, r, out, msg
	}

	t.Run("COMPLETED whatever the exit code, with its output", func(t *testing.T) {
		sb, r, out, msg := run(t, "exit3")
		if r.Status != store.RunCompleted || msg != "" || out["exitCode"] != 3.0 || out["stdout"] != "args [a b c]" || out["stderr"] != "oops" || out["sandboxId"] != sb.ID {
			t.Fatalf("run %s %q, output %v", r.Status, msg, out)
		}
		// The run's work was saved: a snapshot became the account's.
		env, err := n.st.GetEnvironment(ctx, n.account.ID)
		if err != nil || env.SnapshotID == nil || out["snapshotId"] != *env.SnapshotID {
			t.Fatalf("snapshot %v, environment %+v (%v)", out["snapshotId"], env, err)
		}
		if n.execCount("exit3") != 1 {
			t.Fatalf("the command ran %d times", n.execCount("exit3"))
		}
		// The same job delivered again, as River may after a crash, does
		// not run the command again nor touch the finished run.
		if err := n.jc.Insert(ctx, jobs.RunCommandArgs{RunID: r.ID}, "here"); err != nil {
			t.Fatal(err)
		}
		jobsSoFar++
		n.worked(t, jobs.KindRunCommand, jobsSoFar)
		again, _, _ := n.final(t, r.ID)
		if n.execCount("exit3") != 1 || !again.FinishedAt.Equal(*r.FinishedAt) || string(again.Output) != string(r.Output) {
			t.Fatalf("a second delivery: the command ran %d times, run finished %v (was %v)", n.execCount("exit3"), again.FinishedAt, r.FinishedAt)
		}
	})
	t.Run("FAILED when the command does not exist", func(t *testing.T) {
		_, r, out, msg := run(t, "missing")
		if r.Status != store.RunFailed || msg != "command not found: missing" || out["exitCode"] != 127.0 {
			t.Fatalf("run %s %q, output %v", r.Status, msg, out)
		}
	})
	t.Run("CRASHED when the sandbox's agent fails mid-run", func(t *testing.T) {
		_, r, _, msg := run(t, "agentdies")
		if r.Status != store.RunCrashed || !strings.HasPrefix(msg, "the command could not be run to completion") {
			t.Fatalf("run %s %q", r.Status, msg)
		}
	})
	t.Run("one delivery while the run executes does not run it twice", func(t *testing.T) {
		started, release := make(chan struct{}, 2), make(chan struct{})
		n.script("slow", func(context.Context, *runtimefake.Sandbox, runtime.ExecRequest) (runtime.ExecResult, error) {
			started <- struct{}{}
			<-release
			return runtime.ExecResult{}, nil
		})
		_, runID, err := n.mgr.Create(ctx, n.account.ID, sandbox.CreateRequest{Command: "slow"})
		if err != nil {
			t.Fatal(err)
		}
		<-started
		if err := n.jc.Insert(ctx, jobs.RunCommandArgs{RunID: runID}, "here"); err != nil {
			t.Fatal(err)
		}
		// The duplicate finishes while the first still runs the command.
		eventually(t, "the duplicate job completed", func() bool {
			js := n.jobs(t, jobs.KindRunCommand)
			return len(js) == jobsSoFar+2 && js[len(js)-1].State == "completed"
		})
		close(release)
		jobsSoFar += 2
		r, _, _ := n.final(t, runID)
		n.worked(t, jobs.KindRunCommand, jobsSoFar)
		if r.Status != store.RunCompleted || n.execCount("slow") != 1 {
			t.Fatalf("run %s, the command ran %d times; want COMPLETED, once", r.Status, n.execCount("slow"))
		}
	})
	t.Run("FAILED with the output so far when the sandbox reaches its deadline", func(t *testing.T) {
		// The reaper stops the sandbox at its deadline: the command is
		// killed, as a real backend kills it, once the stop is recorded.
		runCtx, stopReaper := context.WithCancel(ctx)
		defer stopReaper()
		go func() { _ = n.mgr.Run(runCtx) }()
		started, killed := make(chan struct{}, 1), make(chan struct{})
		n.script("long", func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
			fmt.Fprint(req.Stdout, "before the deadline")
			started <- struct{}{}
			<-killed
			return runtime.ExecResult{ExitCode: 137, Signal: 9}, nil
		})
		sb, runID, err := n.mgr.Create(ctx, n.account.ID, sandbox.CreateRequest{Command: "long"})
		if err != nil {
			t.Fatal(err)
		}
		<-started
		if _, err := n.mgr.SetTimeout(ctx, auth.Principal{AccountID: sb.AccountID}, sb.ID, 0); err != nil {
			close(killed)
			t.Fatal(err)
		}
		eventually(t, "the sandbox stopped at its deadline", func() bool {
			return n.sandboxRow(t, sb.ID).Status == store.SandboxStopped
		})
		close(killed)
		jobsSoFar++
		r, out, msg := n.final(t, runID)
		n.worked(t, jobs.KindRunCommand, jobsSoFar)
		if r.Status != store.RunFailed || !strings.Contains(msg, "reached its timeout") || out["stdout"] != "before the deadline" {
			t.Fatalf("run %s %q, output %v", r.Status, msg, out)
		}
		if got := n.sandboxRow(t, sb.ID); got.FailureReason != store.ReasonTimeout {
			t.Fatalf("sandbox stopped for %q, want %q", got.FailureReason, store.ReasonTimeout)
		}
	})
}

func TestSetupSandboxJob(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	org := store.Account{Name: "Acme", Kind: store.AccountOrg}
	if err := n.st.CreateAccount(ctx, &org); err != nil {
		t.Fatal(err)
	}
	if err := n.st.AddOrgMember(ctx, org.ID, n.account.ID); err != nil {
		t.Fatal(err)
	}
	n.script("setup", func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		fmt.Fprintf(req.Stdout, "org %s 1111111111111111111111111111111111111111\n", req.Cmd[6])
		return runtime.ExecResult{}, nil
	})
	runID, err := n.agents.Setup(ctx, n.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	r, out, msg := n.final(t, runID)
	n.worked(t, jobs.KindSetupSandbox, 1)
	if r.Status != store.RunCompleted || msg != "" {
		t.Fatalf("setup run %s %q", r.Status, msg)
	}
	// The account's snapshot is the one the setup took, and the
	// organization's repository got its first commit to be a submodule.
	env, err := n.st.GetEnvironment(ctx, n.account.ID)
	if err != nil || env.SnapshotID == nil || out["snapshotId"] != *env.SnapshotID {
		t.Fatalf("output %v, environment %+v (%v)", out, env, err)
	}
	if orgs, _ := out["orgs"].(map[string]any); orgs[org.Slug] != "1111111111111111111111111111111111111111" {
		t.Fatalf("output orgs %v", out["orgs"])
	}
	sbID, _ := out["sandboxId"].(string)
	if sb := n.sandboxRow(t, sbID); sb.Status != store.SandboxStopped || n.rt.Destroys(sbID) != 1 {
		t.Fatalf("the setup's sandbox is %s, destroyed %d times", sb.Status, n.rt.Destroys(sbID))
	}
	// Delivered again, the job starts no second sandbox.
	creates := n.rt.Creates()
	if err := n.jc.Insert(ctx, jobs.SetupSandboxArgs{RunID: runID}, ""); err != nil {
		t.Fatal(err)
	}
	n.worked(t, jobs.KindSetupSandbox, 2)
	if n.rt.Creates() != creates || n.execCount("setup") != 1 {
		t.Fatalf("a second delivery: %d more sandboxes, %d setup scripts", n.rt.Creates()-creates, n.execCount("setup"))
	}

	// A failing script fails the run with its words.
	n.script("setup", func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		fmt.Fprint(req.Stderr, "fatal: could not read from remote repository\n")
		return runtime.ExecResult{ExitCode: 128}, nil
	})
	failedID, err := n.agents.Setup(ctx, n.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	r, _, msg = n.final(t, failedID)
	n.worked(t, jobs.KindSetupSandbox, 3)
	if r.Status != store.RunFailed || msg != "set up the workspace: exit status 128: fatal: could not read from remote repository" {
		t.Fatalf("failed setup: %s %q", r.Status, msg)
	}
}

func TestCodingAgentJob(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	var prompts []string
	n.script("claude", func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		n.mu.Lock()
		prompts = append(prompts, req.Cmd[2])
		n.mu.Unlock()
		if req.Cmd[2] == "fail" {
			fmt.Fprint(req.Stderr, "no credit")
			return runtime.ExecResult{ExitCode: 1}, nil
		}
		fmt.Fprint(req.Stdout, "done")
		return runtime.ExecResult{}, nil
	})
	n.script("push", func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		fmt.Fprint(req.Stdout, " a.txt | 1 +\n")
		return runtime.ExecResult{}, nil
	})
	req := sandbox.CodingAgentRequest{RepoURL: "https://git.example.test/team/app.git", Prompt: "add a.txt", BaseBranch: "main"}
	runID, err := n.agents.CodingAgent(ctx, n.account.ID, req)
	if err != nil {
		t.Fatal(err)
	}
	r, out, msg := n.final(t, runID)
	n.worked(t, jobs.KindCodingAgent, 1)
	if r.Status != store.RunCompleted || msg != "" || out["changed"] != true || out["branch"] != "agent/"+runID || out["stdout"] != "done" {
		t.Fatalf("run %s %q, output %v", r.Status, msg, out)
	}
	sbID, _ := out["sandboxId"].(string)
	if sb := n.sandboxRow(t, sbID); sb.Status != store.SandboxStopped || n.rt.Destroys(sbID) != 1 {
		t.Fatalf("the agent's sandbox is %s, destroyed %d times", sb.Status, n.rt.Destroys(sbID))
	}
	// Delivered again, the job runs no second agent.
	if err := n.jc.Insert(ctx, jobs.CodingAgentArgs{RunID: runID}, ""); err != nil {
		t.Fatal(err)
	}
	n.worked(t, jobs.KindCodingAgent, 2)
	if n.execCount("claude") != 1 {
		t.Fatalf("a second delivery ran the agent again (%d runs)", n.execCount("claude"))
	}

	req.Prompt = "fail"
	failedID, err := n.agents.CodingAgent(ctx, n.account.ID, req)
	if err != nil {
		t.Fatal(err)
	}
	r, out, msg = n.final(t, failedID)
	n.worked(t, jobs.KindCodingAgent, 3)
	if r.Status != store.RunFailed || msg != "claude exited with status 1" || out["stderr"] != "no credit" || n.execCount("push") != 1 {
		t.Fatalf("failed agent: run %s %q, output %v, %d pushes", r.Status, msg, out, n.execCount("push"))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if fmt.Sprint(prompts) != "[add a.txt fail]" {
		t.Fatalf("prompts %q", prompts)
	}
}

func TestStopSandboxJob(t *testing.T) {
	n := newNode(t)
	ctx := context.Background()
	// Another node asks for the stop: it records the decision and queues
	// the job on this node, which hosts the sandbox.
	other, err := jobs.New(ctx, n.st, jobs.Config{NodeID: "other"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	elsewhere := sandbox.NewManager(sandbox.Config{Store: n.st, Runtime: runtimefake.New(), Jobs: other, NodeID: "other", DataDir: t.TempDir(), Hooks: []sandbox.Hook{sandbox.NewKeyHook(sandbox.KeyHookConfig{Store: n.st})}})

	sb, _, err := n.mgr.Create(ctx, n.account.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	asked, err := elsewhere.Stop(ctx, auth.Principal{AccountID: sb.AccountID}, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if asked.Status != store.SandboxStopping {
		t.Fatalf("after another node's stop the sandbox is %s, want stopping until its node acts", asked.Status)
	}
	eventually(t, "the sandbox stopped", func() bool { return n.sandboxRow(t, sb.ID).Status == store.SandboxStopped })
	n.worked(t, jobs.KindStopSandbox, 1)
	stopped := n.sandboxRow(t, sb.ID)
	if stopped.FailureReason != "stopped by request" || n.rt.Destroys(sb.ID) != 1 {
		t.Fatalf("sandbox %s %q, destroyed %d times", stopped.Status, stopped.FailureReason, n.rt.Destroys(sb.ID))
	}
	if js := n.jobs(t, jobs.KindStopSandbox); !strings.Contains(js[0].Args, sb.ID) {
		t.Fatalf("stop job args %s", js[0].Args)
	}

	// Idempotent: delivered again, and asked again, nothing more happens.
	if err := n.jc.Insert(ctx, jobs.StopSandboxArgs{SandboxID: sb.ID, Reason: "again"}, "here"); err != nil {
		t.Fatal(err)
	}
	if _, err := elsewhere.Stop(ctx, auth.Principal{AccountID: stopped.AccountID}, stopped.ID); err != nil {
		t.Fatal(err)
	}
	n.worked(t, jobs.KindStopSandbox, 3)
	after := n.sandboxRow(t, sb.ID)
	if after.Status != store.SandboxStopped || after.FailureReason != "stopped by request" || !after.UpdatedAt.Equal(stopped.UpdatedAt) || n.rt.Destroys(sb.ID) != 1 {
		t.Fatalf("after more stops: %s %q (updated %v, was %v), destroyed %d times", after.Status, after.FailureReason, after.UpdatedAt, stopped.UpdatedAt, n.rt.Destroys(sb.ID))
	}

	// A sandbox its host lost meanwhile is still marked stopped.
	lost, _, err := n.mgr.Create(ctx, n.account.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n.rt.Lose(lost.ID)
	if _, err := elsewhere.Stop(ctx, auth.Principal{AccountID: lost.AccountID}, lost.ID); err != nil {
		t.Fatal(err)
	}
	n.worked(t, jobs.KindStopSandbox, 4)
	if got := n.sandboxRow(t, lost.ID); got.Status != store.SandboxStopped {
		t.Fatalf("a lost sandbox's stop left it %s", got.Status)
	}
}
