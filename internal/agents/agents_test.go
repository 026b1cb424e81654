package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// These tests run the setup-sandbox and coding-agent tasks as serve wires
// them: the real sandbox manager (its keys, quotas and stops) as the
// Lifecycle, over a real SQLite store and River client, with the in-memory
// sandboxes of runtimefake. What the sandbox's processes do is scripted per
// script (the task's scripts are matched by their text). Persistence is a
// recording stand-in whose forge check is the real forge.Mirror over a
// real GitHub client, which talks to a loopback stand-in of GitHub's API.

func TestMain(m *testing.M) { storetest.Main(m) }

// operatorToken is the GitHub token the operator configured: it must never
// reach a sandbox.
const operatorToken = "ghp_OPERATOR_SECRET_0123456789abcdef"

const forgeOwner = "octo"

// fakePersist is the persistence the tasks and the manager see.
type fakePersist struct {
	mirror *forge.Mirror

	mu          sync.Mutex
	initialized []string // organization ids
	snapshots   []string // sandbox ids
	mirrored    []string // account ids
	prepareErr  error
}

var (
	_ sandbox.Persistence = (*fakePersist)(nil)
	_ sandbox.ForgeMirror = (*fakePersist)(nil)
	_ Persistence         = (*fakePersist)(nil)
)

// gitEnvHook gives sandboxes git's credentials, as persistence's hook does.
type gitEnvHook struct{}

func (gitEnvHook) Name() string          { return "git" }
func (gitEnvHook) FailureReason() string { return "git" }
func (gitEnvHook) Prestart(_ context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	spec.Env = append(spec.Env, persist.GitEnv(sb.ID)...)
	return nil
}
func (p *fakePersist) Prepare(context.Context, store.Sandbox, runtime.Sandbox, bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepareErr
}
func (p *fakePersist) AfterRun(context.Context, store.Sandbox, runtime.Sandbox, store.Run) (runs.Saved, error) {
	return runs.Saved{}, nil
}
func (p *fakePersist) Snapshot(_ context.Context, sb store.Sandbox, _ runtime.Sandbox) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.snapshots = append(p.snapshots, sb.ID)
	return fmt.Sprintf("snap_%d", len(p.snapshots)), nil
}
func (p *fakePersist) Initialize(_ context.Context, a store.Account) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.initialized = append(p.initialized, a.ID)
	return nil
}
func (p *fakePersist) DeleteAccount(context.Context, string) error { return nil }
func (p *fakePersist) OwnsRepo(accountID, url string) error {
	return p.mirror.OwnsRepo(accountID, url)
}
func (p *fakePersist) MirrorNow(_ context.Context, accountID string) (forge.Repo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mirrored = append(p.mirrored, accountID)
	name := forgeOwner + "/" + p.mirror.RepoName(accountID)
	return forge.Repo{FullName: name, HTMLURL: "https://github.com/" + name}, nil
}

// pullRequest is what the GitHub stand-in was asked to open.
type pullRequest struct {
	Path  string `json:"-"`
	Title string `json:"title"`
	Head  string `json:"head"`
	Base  string `json:"base"`
	Body  string `json:"body"`
}

// githubStub answers the pull-request route of GitHub's API.
type githubStub struct {
	mu  sync.Mutex
	prs []pullRequest
}

func (g *githubStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/pulls") {
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
		return
	}
	var pr pullRequest
	if err := json.NewDecoder(r.Body).Decode(&pr); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	pr.Path = r.URL.Path
	g.mu.Lock()
	g.prs = append(g.prs, pr)
	n := len(g.prs)
	g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"number": %d, "html_url": "https://github.com%s/%d"}`, n, strings.TrimPrefix(strings.TrimSuffix(r.URL.Path, "s"), "/repos"), n)
}

func (g *githubStub) pulls() []pullRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.prs)
}

// execRecord is one process a task started in a sandbox.
type execRecord struct {
	sandbox string
	kind    string // setup, clone, claude, push, or the command
	args    []string
	req     runtime.ExecRequest
}

// scriptFunc scripts one kind of process: args are its $1, $2, ...
type scriptFunc func(args []string, req runtime.ExecRequest) (runtime.ExecResult, error)

type harness struct {
	st      *store.Store
	jc      *jobs.Client
	rt      *runtimefake.Runtime
	mgr     *sandbox.Manager
	svc     *Service
	fp      *fakePersist
	github  *githubStub
	auth    *auth.Authenticator
	account store.Account

	mu        sync.Mutex
	execs     []execRecord
	sandboxes map[string]*runtimefake.Sandbox
	scripts   map[string]scriptFunc
	later     time.Duration // added to the tasks' clock
}

type options struct {
	settings  sandbox.Settings
	noPersist bool
	agentRuns int
}

func newHarness(t *testing.T, o options) *harness {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jc.Close() })
	h := &harness{st: st, jc: jc, rt: runtimefake.New(), github: &githubStub{}, auth: auth.NewAuthenticator(st), sandboxes: map[string]*runtimefake.Sandbox{}}
	h.scripts = map[string]scriptFunc{
		// The setup script prints one line per organization.
		"setup": func(args []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
			for i := 2; i+1 < len(args); i += 2 {
				fmt.Fprintf(req.Stdout, "org %s %040d\n", args[i], i)
			}
			return runtime.ExecResult{}, nil
		},
		"clone": func([]string, runtime.ExecRequest) (runtime.ExecResult, error) { return runtime.ExecResult{}, nil },
		"claude": func(_ []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
			// Colours, as a CLI that ignores NO_COLOR prints them.
			fmt.Fprint(req.Stdout, "\x1b[1mI changed\x1b[0m f.txt")
			fmt.Fprint(req.Stderr, "\x1b]0;claude\x07thinking")
			return runtime.ExecResult{}, nil
		},
		"push": func(_ []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
			fmt.Fprint(req.Stdout, " f.txt | 1 +\n 1 file changed, 1 insertion(+)\n")
			return runtime.ExecResult{}, nil
		},
	}
	h.rt.SetExec(h.exec)
	srv := httptest.NewServer(h.github)
	t.Cleanup(srv.Close)
	gh, err := forge.NewGitHub(forge.Options{Token: operatorToken, Owner: forgeOwner, BaseURL: srv.URL + "/"})
	if err != nil {
		t.Fatal(err)
	}
	mirror, err := forge.NewMirror(forge.MirrorOptions{Forge: gh, Token: operatorToken})
	if err != nil {
		t.Fatal(err)
	}
	h.fp = &fakePersist{mirror: mirror}
	// As serve configures it when a model key is set.
	// The hooks serve registers: the sandbox's key (with Claude Code pointed
	// at the model proxy) and git's credentials.
	hooks := []sandbox.Hook{sandbox.NewKeyHook(sandbox.KeyHookConfig{Store: st, AnthropicProxy: true}), gitEnvHook{}}
	setups := NewSetups(st, jc)
	h.mgr = sandbox.NewManager(sandbox.Config{Store: st, Runtime: h.rt, Jobs: jc, NodeID: "here", DataDir: t.TempDir(), Settings: o.settings, Persist: h.fp, Hooks: hooks, Setups: setups})
	cfg := Config{
		Store: st, Jobs: jc, Lifecycle: h.mgr, Persist: h.fp, Forge: gh, Setups: setups,
		PublicURL: "https://sandboxd.example.test", Network: netpol.Policy{Mode: netpol.ModeNone},
		AgentRunsPerAccount: o.agentRuns, Now: h.now,
	}
	if o.noPersist {
		cfg.Persist = nil
	}
	h.svc = New(cfg)
	h.account = h.newAccount(t, "alice", store.AccountPersonal)
	return h
}

func (h *harness) now() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Now().Add(h.later)
}

func (h *harness) newAccount(t *testing.T, name string, kind store.AccountKind) store.Account {
	t.Helper()
	a := store.Account{Name: name, Kind: kind}
	if err := h.st.CreateAccount(context.Background(), &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// exec is the sandboxes' process table: it records every process and
// runs the script of its kind.
func (h *harness) exec(_ context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
	rec := execRecord{sandbox: sb.ID(), kind: req.Cmd[0], args: req.Cmd[1:], req: req}
	switch {
	case len(req.Cmd) >= 4 && req.Cmd[0] == "/bin/sh" && req.Cmd[1] == "-c":
		rec.args = req.Cmd[4:]
		switch req.Cmd[2] {
		case setupScript:
			rec.kind = "setup"
		case cloneScript:
			rec.kind = "clone"
		case pushScript:
			rec.kind = "push"
		default:
			rec.kind = "sh"
		}
	case len(req.Cmd) >= 2 && req.Cmd[0] == "/bin/sh" && req.Cmd[1] == "/tmp/ralph-once.sh":
		rec.kind, rec.args = "claude", req.Cmd[2:]
	}
	h.mu.Lock()
	h.execs = append(h.execs, rec)
	h.sandboxes[sb.ID()] = sb
	fn := h.scripts[rec.kind]
	h.mu.Unlock()
	if fn == nil {
		return runtime.ExecResult{}, nil
	}
	return fn(rec.args, req)
}

func (h *harness) script(kind string, fn scriptFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.scripts[kind] = fn
}

func (h *harness) execsOf(kind string) []execRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []execRecord
	for _, e := range h.execs {
		if e.kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// work delivers the job of run runID to its worker, as River does.
func (h *harness) work(t *testing.T, runID string) error {
	t.Helper()
	run, err := h.st.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	switch run.Task {
	case jobs.KindSetupSandbox:
		w := &setupWorker{s: h.svc}
		return w.Work(context.Background(), &river.Job[jobs.SetupSandboxArgs]{Args: jobs.SetupSandboxArgs{RunID: runID}})
	case jobs.KindCodingAgent:
		w := &codingAgentWorker{s: h.svc}
		return w.Work(context.Background(), &river.Job[jobs.CodingAgentArgs]{Args: jobs.CodingAgentArgs{RunID: runID}})
	}
	t.Fatalf("run %s is of task %s", runID, run.Task)
	return nil
}

// finished delivers the run's job, which must not fail, and returns the run
// with its decoded output and error message.
func (h *harness) finished(t *testing.T, runID string) (store.Run, map[string]any, string) {
	t.Helper()
	if err := h.work(t, runID); err != nil {
		t.Fatalf("work %s: %v", runID, err)
	}
	return h.result(t, runID)
}

func (h *harness) result(t *testing.T, runID string) (store.Run, map[string]any, string) {
	t.Helper()
	run, err := h.st.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
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

// jobCount counts River's jobs of kind.
func (h *harness) jobCount(t *testing.T, kind string) int {
	t.Helper()
	var n int
	if err := h.st.DB().QueryRowContext(context.Background(), `SELECT count(*) FROM river_job WHERE kind = ?`, kind).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (h *harness) runsOf(t *testing.T, accountID, task string) []store.Run {
	t.Helper()
	all, err := h.st.ListRuns(context.Background(), accountID, 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Run
	for _, r := range all {
		if r.Task == task {
			out = append(out, r)
		}
	}
	return out
}

// taskSandbox checks that the task ran in one sandbox of the account, now
// stopped with reason and destroyed once, whose key no longer works.
func (h *harness) taskSandbox(t *testing.T, id, reason string) {
	t.Helper()
	sb, err := h.st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatalf("the run's sandboxId %q: %v", id, err)
	}
	if sb.AccountID != h.account.ID || sb.Status != store.SandboxStopped || sb.FailureReason != reason {
		t.Fatalf("task sandbox: account %s, %s %q; want %s's, stopped %q", sb.AccountID, sb.Status, sb.FailureReason, h.account.ID, reason)
	}
	if n := h.rt.Destroys(id); n != 1 {
		t.Fatalf("task sandbox destroyed %d times, want once", n)
	}
	key := envValue(h.spec(t, id).Env, "RECOUP_API_KEY")
	if key == "" {
		t.Fatal("the task's sandbox had no key of its own")
	}
	if _, err := h.auth.Authenticate(context.Background(), key); err == nil {
		t.Fatal("the key of the task's stopped sandbox still authenticates")
	}
}

func (h *harness) spec(t *testing.T, id string) runtime.Spec {
	t.Helper()
	s, ok := h.rt.Spec(id)
	if !ok {
		t.Fatalf("the runtime never created %s", id)
	}
	return s
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

func TestSetupRecordsItsRun(t *testing.T) {
	h := newHarness(t, options{})
	ctx := context.Background()
	orgA := h.newAccount(t, "Acme", store.AccountOrg)
	orgB := h.newAccount(t, "Beta", store.AccountOrg)
	for _, o := range []store.Account{orgA, orgB} {
		if err := h.st.AddOrgMember(ctx, o.ID, h.account.ID); err != nil {
			t.Fatal(err)
		}
	}
	runID, err := h.svc.Setup(ctx, h.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r, _, _ := h.result(t, runID); r.Status != store.RunQueued || h.jobCount(t, jobs.KindSetupSandbox) != 1 {
		t.Fatalf("after Setup the run is %s with %d jobs, want QUEUED with its one job", r.Status, h.jobCount(t, jobs.KindSetupSandbox))
	}

	run, out, msg := h.finished(t, runID)
	if run.Status != store.RunCompleted || msg != "" || run.StartedAt == nil || run.FinishedAt == nil {
		t.Fatalf("run %s %q (started %v, finished %v), want COMPLETED", run.Status, msg, run.StartedAt, run.FinishedAt)
	}
	// The script ran once, in /workspace of the task's sandbox, with the
	// sandbox, the account, then each organization's slug and id.
	setups := h.execsOf("setup")
	if len(setups) != 1 {
		t.Fatalf("%d setup scripts ran, want 1", len(setups))
	}
	// (Organizations made in one millisecond come in either order.)
	sbID, args := setups[0].sandbox, setups[0].args
	pairs := map[string]string{}
	for i := 2; i+1 < len(args); i += 2 {
		pairs[args[i]] = args[i+1]
	}
	wantPairs := map[string]string{orgA.Slug: orgA.ID, orgB.Slug: orgB.ID}
	if len(args) != 6 || args[0] != sbID || args[1] != h.account.ID || fmt.Sprint(pairs) != fmt.Sprint(wantPairs) || setups[0].req.Cwd != "/workspace" {
		t.Fatalf("setup script args %v in %q, want the sandbox, the account, then %v, in /workspace", args, setups[0].req.Cwd, wantPairs)
	}
	// The output: each organization's commit (as the script printed it),
	// the snapshot, the sandbox.
	commits := map[string]any{}
	for i := 2; i+1 < len(args); i += 2 {
		commits[args[i]] = fmt.Sprintf("%040d", i)
	}
	wantOut := map[string]any{"orgs": commits, "snapshotId": "snap_1", "sandboxId": sbID}
	if fmt.Sprint(out) != fmt.Sprint(wantOut) {
		t.Fatalf("output %v, want %v", out, wantOut)
	}
	h.fp.mu.Lock()
	inits, snaps := slices.Clone(h.fp.initialized), slices.Clone(h.fp.snapshots)
	h.fp.mu.Unlock()
	slices.Sort(inits)
	wantInits := []string{orgA.ID, orgB.ID}
	slices.Sort(wantInits)
	if !slices.Equal(inits, wantInits) || !slices.Equal(snaps, []string{sbID}) {
		t.Fatalf("initialised %v, snapshotted %v; want both organizations and the task's sandbox", inits, snaps)
	}
	h.taskSandbox(t, sbID, "setup-sandbox finished")
	// The run names its sandbox, which says whose task it is (the
	// account's lists leave the setup's out).
	if sb, _ := h.st.GetSandbox(ctx, sbID); run.SandboxID != sbID || sb.Task != store.SandboxTaskSetup {
		t.Fatalf("run names sandbox %q, want %s; its task is %q", run.SandboxID, sbID, sb.Task)
	}

	// The job delivered again (River may) starts nothing: only a QUEUED
	// run starts.
	creates := h.rt.Creates()
	if err := h.work(t, runID); err != nil {
		t.Fatal(err)
	}
	again, _, _ := h.result(t, runID)
	if h.rt.Creates() != creates || len(h.execsOf("setup")) != 1 || !again.FinishedAt.Equal(*run.FinishedAt) || again.Status != store.RunCompleted {
		t.Fatalf("a second delivery: %d creates (was %d), %d setup scripts, run %s", h.rt.Creates(), creates, len(h.execsOf("setup")), again.Status)
	}
}

func TestSetupFailureKeepsTheScriptsStderrTail(t *testing.T) {
	h := newHarness(t, options{})
	ctx := context.Background()
	org := h.newAccount(t, "Acme", store.AccountOrg)
	if err := h.st.AddOrgMember(ctx, org.ID, h.account.ID); err != nil {
		t.Fatal(err)
	}
	h.script("setup", func(args []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
		fmt.Fprintf(req.Stdout, "org %s %040d\n", args[2], 7)
		for i := 1; i <= 8; i++ {
			fmt.Fprintf(req.Stderr, "stderr line %d\n", i)
		}
		return runtime.ExecResult{ExitCode: 2}, nil
	})
	runID, err := h.svc.Setup(ctx, h.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	run, out, msg := h.finished(t, runID)
	wantMsg := "set up the workspace: exit status 2: stderr line 4\nstderr line 5\nstderr line 6\nstderr line 7\nstderr line 8"
	if run.Status != store.RunFailed || msg != wantMsg {
		t.Fatalf("run %s with error %q, want FAILED with %q", run.Status, msg, wantMsg)
	}
	// What the script did before it failed is in the output; no snapshot
	// was taken of a half-done workspace.
	orgs, _ := out["orgs"].(map[string]any)
	sbID, _ := out["sandboxId"].(string)
	if orgs[org.Slug] != fmt.Sprintf("%040d", 7) || out["snapshotId"] != nil || sbID == "" {
		t.Fatalf("output %v, want the organization reached, the sandbox, no snapshot", out)
	}
	h.fp.mu.Lock()
	snaps := len(h.fp.snapshots)
	h.fp.mu.Unlock()
	if snaps != 0 {
		t.Fatalf("%d snapshots after a failed setup, want none", snaps)
	}
	h.taskSandbox(t, sbID, "setup-sandbox finished")
}

func TestSetupFailsWhenTheWorkspaceCannotBePrepared(t *testing.T) {
	h := newHarness(t, options{})
	h.fp.prepareErr = errors.New("clone /var/lib/sandboxd/repos/x: disk full")
	runID, err := h.svc.Setup(context.Background(), h.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	run, out, msg := h.finished(t, runID)
	// The host's error stays in the log; the script never ran.
	if run.Status != store.RunFailed || msg != "setup-sandbox failed (details are in the server log)" || len(h.execsOf("setup")) != 0 {
		t.Fatalf("run %s %q, %d setup scripts", run.Status, msg, len(h.execsOf("setup")))
	}
	sbID, _ := out["sandboxId"].(string)
	h.taskSandbox(t, sbID, "setup-sandbox finished")
}

func TestSetupWithoutPersistenceFails(t *testing.T) {
	h := newHarness(t, options{noPersist: true})
	runID, err := h.svc.Setup(context.Background(), h.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	run, _, _ := h.finished(t, runID)
	if run.Status != store.RunFailed || len(h.execsOf("setup")) != 0 {
		t.Fatalf("setup without persistence: run %s, %d scripts; want FAILED, none", run.Status, len(h.execsOf("setup")))
	}
}

func TestSetupsFirstUse(t *testing.T) {
	h := newHarness(t, options{settings: sandbox.Settings{SetupOnFirstUse: true}})
	ctx := context.Background()

	// Two requests for a setup get one run.
	first, err := h.svc.Setup(ctx, h.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	second, err := h.svc.Setup(ctx, h.account.ID)
	if err != nil || second != first {
		t.Fatalf("second Setup: %q, %v; want the queued %q", second, err, first)
	}
	if !h.svc.setups.Pending(ctx, h.account.ID) || !h.mgr.SetupPending(ctx, h.account.ID) {
		t.Fatal("a queued setup is not pending")
	}
	// Neither IfNew nor a new sandbox adds another while it is queued.
	if err := h.svc.setups.IfNew(ctx, h.account.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.mgr.Create(ctx, h.account.ID, sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := len(h.runsOf(t, h.account.ID, jobs.KindSetupSandbox)); n != 1 || h.jobCount(t, jobs.KindSetupSandbox) != 1 {
		t.Fatalf("%d setup runs and %d jobs while one is queued, want 1", n, h.jobCount(t, jobs.KindSetupSandbox))
	}
	if run, _, _ := h.finished(t, first); run.Status != store.RunCompleted {
		t.Fatalf("setup run %s", run.Status)
	}
	if h.svc.setups.Pending(ctx, h.account.ID) || h.mgr.SetupPending(ctx, h.account.ID) {
		t.Fatal("a completed setup is still pending")
	}
	// An account that had its setup is not set up again on first use.
	if _, _, err := h.mgr.Create(ctx, h.account.ID, sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if n := len(h.runsOf(t, h.account.ID, jobs.KindSetupSandbox)); n != 1 {
		t.Fatalf("%d setup runs after the account's setup, want 1", n)
	}
	// An explicit Setup after the first finished starts a new one.
	if again, err := h.svc.Setup(ctx, h.account.ID); err != nil || again == first {
		t.Fatalf("Setup after the first finished: %q, %v; want a new run", again, err)
	}

	// A new account's first sandbox queues its setup, once.
	bob := h.newAccount(t, "bob", store.AccountPersonal)
	for range 2 {
		if _, _, err := h.mgr.Create(ctx, bob.ID, sandbox.CreateRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(h.runsOf(t, bob.ID, jobs.KindSetupSandbox)); n != 1 || !h.svc.setups.Pending(ctx, bob.ID) {
		t.Fatalf("bob's first sandboxes queued %d setups (pending %v), want 1", n, h.svc.setups.Pending(ctx, bob.ID))
	}

	// An account that already has an environment is not set up.
	carol := h.newAccount(t, "carol", store.AccountPersonal)
	now := time.Now()
	if err := h.st.UpsertEnvironment(ctx, &store.Environment{AccountID: carol.ID, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := h.svc.setups.IfNew(ctx, carol.ID); err != nil {
		t.Fatal(err)
	}
	if n := len(h.runsOf(t, carol.ID, jobs.KindSetupSandbox)); n != 0 || h.svc.setups.Pending(ctx, carol.ID) {
		t.Fatalf("carol, who has an environment, got %d setups", n)
	}
}

func TestConcurrentSetupsShareOneRun(t *testing.T) {
	h := newHarness(t, options{})
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids = map[string]bool{}
	)
	for range 8 {
		wg.Go(func() {
			id, err := h.svc.Setup(context.Background(), h.account.ID)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ids[id] = true
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(ids) != 1 || h.jobCount(t, jobs.KindSetupSandbox) != 1 {
		t.Fatalf("8 concurrent setups made runs %v and %d jobs, want one of each", ids, h.jobCount(t, jobs.KindSetupSandbox))
	}
}

// mirrorURL is the account's own mirror on GitHub.
func (h *harness) mirrorURL() string {
	return "https://github.com/" + forgeOwner + "/" + h.fp.mirror.RepoName(h.account.ID)
}

func TestCodingAgentOnTheAccountsMirror(t *testing.T) {
	h := newHarness(t, options{})
	ctx := context.Background()
	prompt := "Fix the flaky test\n\nIt fails on Tuesdays; `rm -rf /` is not the fix. $HOME \"quoted\""
	runID, err := h.svc.CodingAgent(ctx, h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: prompt, BaseBranch: "release"})
	if err != nil {
		t.Fatal(err)
	}
	queued, _, _ := h.result(t, runID)
	var payload codingAgentPayload
	if err := json.Unmarshal(queued.Payload, &payload); err != nil || payload != (codingAgentPayload{RepoURL: h.mirrorURL(), Prompt: prompt, BaseBranch: "release", AccountID: h.account.ID}) {
		t.Fatalf("payload %s (%v)", queued.Payload, err)
	}
	if queued.Status != store.RunQueued || h.jobCount(t, jobs.KindCodingAgent) != 1 {
		t.Fatalf("run %s with %d jobs", queued.Status, h.jobCount(t, jobs.KindCodingAgent))
	}

	run, out, msg := h.finished(t, runID)
	if run.Status != store.RunCompleted || msg != "" {
		t.Fatalf("run %s %q, want COMPLETED", run.Status, msg)
	}
	// The sandbox clones the account's repository on sandboxd, never the
	// forge: it holds no forge credential.
	clones := h.execsOf("clone")
	if len(clones) != 1 || !slices.Equal(clones[0].args, []string{"http://sandboxd.internal/git/" + h.account.ID + ".git", "/workspace/agent-repo", "release"}) {
		t.Fatalf("clones %+v", clones)
	}
	// Claude Code gets the prompt as one argument, in the clone.
	claude := h.execsOf("claude")
	if len(claude) != 1 || !slices.Equal(claude[0].args, []string{prompt}) || claude[0].req.Cwd != "/workspace/agent-repo" {
		t.Fatalf("claude runs %+v, want one with the prompt as its only argument", claude)
	}
	// Without a terminal: its output is stored as text (below, stripped).
	if env := claude[0].req.Env; !slices.Contains(env, "NO_COLOR=1") || !slices.Contains(env, "TERM=dumb") {
		t.Fatalf("claude's environment %q: want colours off", env)
	}
	sbID := clones[0].sandbox
	if script, _ := h.sandboxes[sbID].File("/tmp/ralph-once.sh"); string(script) != ralphOnceScript {
		t.Fatalf("ralph-once.sh is %q", script)
	}
	branch := "agent/" + runID
	pushes := h.execsOf("push")
	if len(pushes) != 1 || !slices.Equal(pushes[0].args, []string{branch, "Agent: Fix the flaky test"}) {
		t.Fatalf("pushes %+v", pushes)
	}
	// The host mirrors the branch to the forge and opens the pull request.
	prs := h.github.pulls()
	mirrorName := forgeOwner + "/" + h.fp.mirror.RepoName(h.account.ID)
	if len(prs) != 1 || prs[0].Path != "/repos/"+mirrorName+"/pulls" || prs[0].Head != branch || prs[0].Base != "release" || prs[0].Title != "Agent: Fix the flaky test" ||
		!strings.HasPrefix(prs[0].Body, prompt) || !strings.Contains(prs[0].Body, "Run "+runID) {
		t.Fatalf("pull requests %+v", prs)
	}
	want := map[string]any{
		"exitCode": 0.0, "stdout": "I changed f.txt", "stderr": "thinking",
		"changed": true, "branch": branch, "diffStat": " f.txt | 1 +\n 1 file changed, 1 insertion(+)",
		"pullRequest": "https://github.com/" + mirrorName + "/pull/1", "pullRequestNumber": 1.0,
		"sandboxId": sbID,
	}
	if fmt.Sprint(out) != fmt.Sprint(want) {
		t.Fatalf("output\n%v\nwant\n%v", out, want)
	}
	h.taskSandbox(t, sbID, "coding-agent finished")
	if sb, _ := h.st.GetSandbox(ctx, sbID); run.SandboxID != sbID || sb.Task != jobs.KindCodingAgent {
		t.Fatalf("run names sandbox %q, want %s; its task is %q", run.SandboxID, sbID, sb.Task)
	}
}

func TestCodingAgentRefusesAnotherRepository(t *testing.T) {
	h := newHarness(t, options{})
	ctx := context.Background()
	for _, url := range []string{
		"https://github.com/octo/secret-product",
		"https://github.com/someone-else/sandbox-" + h.account.ID,
		"https://github.com/" + forgeOwner + "/sandbox-acct_other",
	} {
		_, err := h.svc.CodingAgent(ctx, h.account.ID, sandbox.CodingAgentRequest{RepoURL: url, Prompt: "p", BaseBranch: "main"})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(errdefs.Message(err, ""), "repo_url: ") {
			t.Errorf("coding agent on %s: %v, want a 400 about repo_url", url, err)
		}
	}
	if n := len(h.runsOf(t, h.account.ID, jobs.KindCodingAgent)); n != 0 || h.jobCount(t, jobs.KindCodingAgent) != 0 {
		t.Fatalf("refused requests left %d runs and %d jobs", n, h.jobCount(t, jobs.KindCodingAgent))
	}

	// A run recorded without the check (before it existed, say) is refused
	// when it runs: nothing is cloned and no pull request opened.
	runID, err := EnqueueTask(ctx, h.st, h.jc, h.account.ID, jobs.KindCodingAgent, codingAgentPayload{
		RepoURL: "https://github.com/octo/secret-product", Prompt: "p", BaseBranch: "main", AccountID: h.account.ID,
	})
	if err != nil {
		t.Fatal(err)
	}
	run, _, msg := h.finished(t, runID)
	if run.Status != store.RunFailed || !strings.Contains(msg, "https://github.com/octo/secret-product is not this account's mirror") {
		t.Fatalf("run %s %q, want FAILED saying the repository is not the account's", run.Status, msg)
	}
	if n := len(h.execsOf("clone")) + len(h.execsOf("claude")) + len(h.github.pulls()); n != 0 {
		t.Fatalf("a refused run cloned, ran or opened %d things", n)
	}
}

func TestCodingAgentOnAnotherHost(t *testing.T) {
	h := newHarness(t, options{})
	ctx := context.Background()
	cases := map[string]string{
		// This server's own repositories are reached inside.
		"https://sandboxd.example.test/git/" + h.account.ID + ".git": "http://sandboxd.internal/git/" + h.account.ID + ".git",
		// Other hosts are cloned as named; no forge credential is involved.
		"https://gitlab.example.test/team/app.git": "https://gitlab.example.test/team/app.git",
	}
	for url, inside := range cases {
		h.mu.Lock()
		h.execs = nil
		h.mu.Unlock()
		runID, err := h.svc.CodingAgent(ctx, h.account.ID, sandbox.CodingAgentRequest{RepoURL: url, Prompt: "p", BaseBranch: "dev"})
		if err != nil {
			t.Fatal(err)
		}
		run, out, msg := h.finished(t, runID)
		clones := h.execsOf("clone")
		if run.Status != store.RunCompleted || len(clones) != 1 || clones[0].args[0] != inside || clones[0].args[2] != "dev" {
			t.Fatalf("%s: run %s %q, clones %+v; want %s cloned at dev", url, run.Status, msg, clones, inside)
		}
		// Not on the forge: no pull request, and the output says changed.
		if out["changed"] != true || out["pullRequest"] != nil || out["pullRequestError"] != nil {
			t.Fatalf("%s: output %v", url, out)
		}
	}
	if n := len(h.github.pulls()); n != 0 {
		t.Fatalf("%d pull requests for repositories off the forge", n)
	}
}

func TestCodingAgentFailures(t *testing.T) {
	t.Run("claude exits non-zero", func(t *testing.T) {
		h := newHarness(t, options{})
		h.script("claude", func(_ []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
			fmt.Fprint(req.Stdout, "half")
			fmt.Fprint(req.Stderr, "rate limited")
			return runtime.ExecResult{ExitCode: 3}, nil
		})
		runID, err := h.svc.CodingAgent(context.Background(), h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"})
		if err != nil {
			t.Fatal(err)
		}
		run, out, msg := h.finished(t, runID)
		if run.Status != store.RunFailed || msg != "claude exited with status 3" || out["exitCode"] != 3.0 || out["stdout"] != "half" || out["stderr"] != "rate limited" {
			t.Fatalf("run %s %q, output %v", run.Status, msg, out)
		}
		if len(h.execsOf("push")) != 0 || len(h.github.pulls()) != 0 {
			t.Fatal("a failed agent's work was pushed")
		}
		h.taskSandbox(t, out["sandboxId"].(string), "coding-agent finished")
	})
	t.Run("claude runs out of time", func(t *testing.T) {
		h := newHarness(t, options{})
		h.script("claude", func(_ []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
			fmt.Fprint(req.Stdout, "still thinking")
			return runtime.ExecResult{ExitCode: 137, Signal: 9, TimedOut: true}, nil
		})
		runID, err := h.svc.CodingAgent(context.Background(), h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"})
		if err != nil {
			t.Fatal(err)
		}
		run, out, msg := h.finished(t, runID)
		if run.Status != store.RunFailed || msg != "claude did not finish within 30m0s" || out["exitCode"] != 137.0 || out["stdout"] != "still thinking" || len(h.execsOf("push")) != 0 {
			t.Fatalf("run %s %q, output %v", run.Status, msg, out)
		}
	})
	t.Run("the setup script runs out of time", func(t *testing.T) {
		h := newHarness(t, options{})
		h.script("setup", func(_ []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
			fmt.Fprint(req.Stderr, "Cloning into 'orgs/acme'...\n")
			return runtime.ExecResult{ExitCode: 137, Signal: 9, TimedOut: true}, nil
		})
		runID, err := h.svc.Setup(context.Background(), h.account.ID)
		if err != nil {
			t.Fatal(err)
		}
		run, _, msg := h.finished(t, runID)
		if run.Status != store.RunFailed || msg != "set up the workspace: did not finish within 30m0s: Cloning into 'orgs/acme'..." {
			t.Fatalf("run %s %q", run.Status, msg)
		}
	})
	t.Run("the clone fails", func(t *testing.T) {
		h := newHarness(t, options{})
		h.script("clone", func(_ []string, req runtime.ExecRequest) (runtime.ExecResult, error) {
			fmt.Fprint(req.Stderr, "Cloning...\nfatal: Remote branch nope not found in upstream origin\n")
			return runtime.ExecResult{ExitCode: 128}, nil
		})
		url := "https://gitlab.example.test/team/app.git"
		runID, err := h.svc.CodingAgent(context.Background(), h.account.ID, sandbox.CodingAgentRequest{RepoURL: url, Prompt: "p", BaseBranch: "nope"})
		if err != nil {
			t.Fatal(err)
		}
		run, _, msg := h.finished(t, runID)
		want := "clone " + url + " at nope: exit status 128: Cloning...\nfatal: Remote branch nope not found in upstream origin"
		if run.Status != store.RunFailed || msg != want || len(h.execsOf("claude")) != 0 {
			t.Fatalf("run %s %q, want FAILED %q before claude", run.Status, msg, want)
		}
	})
	t.Run("nothing changed", func(t *testing.T) {
		h := newHarness(t, options{})
		h.script("push", func([]string, runtime.ExecRequest) (runtime.ExecResult, error) { return runtime.ExecResult{}, nil })
		runID, err := h.svc.CodingAgent(context.Background(), h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"})
		if err != nil {
			t.Fatal(err)
		}
		run, out, _ := h.finished(t, runID)
		if run.Status != store.RunCompleted || out["changed"] != false || out["branch"] != nil || len(h.github.pulls()) != 0 {
			t.Fatalf("run %s, output %v, %d pull requests", run.Status, out, len(h.github.pulls()))
		}
	})
	t.Run("the image has no claude", func(t *testing.T) {
		h := newHarness(t, options{settings: sandbox.Settings{Commands: map[string]bool{"opencode": true}, Image: "template base"}})
		_, err := h.svc.CodingAgent(context.Background(), h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "claude") || len(h.runsOf(t, h.account.ID, jobs.KindCodingAgent)) != 0 {
			t.Fatalf("coding agent without claude: %v", err)
		}
	})
	t.Run("the account's runs are limited", func(t *testing.T) {
		h := newHarness(t, options{agentRuns: 1})
		req := sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"}
		first, err := h.svc.CodingAgent(context.Background(), h.account.ID, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.svc.CodingAgent(context.Background(), h.account.ID, req); !errors.Is(err, errdefs.ErrQuota) {
			t.Fatalf("a second queued run beyond the limit of 1: %v, want a quota error", err)
		}
		// A finished run frees its place.
		h.finished(t, first)
		if _, err := h.svc.CodingAgent(context.Background(), h.account.ID, req); err != nil {
			t.Fatalf("a run after the first finished: %v", err)
		}
	})
}

func TestTasksWaitForAQuotaPlace(t *testing.T) {
	h := newHarness(t, options{settings: sandbox.Settings{PerAccount: 1}})
	ctx := context.Background()
	if _, _, err := h.mgr.Create(ctx, h.account.ID, sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	runID, err := h.svc.CodingAgent(ctx, h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	creates := h.rt.Creates()
	// At the quota the job waits, queued, without a sandbox.
	var snooze *river.JobSnoozeError
	if err := h.work(t, runID); !errors.As(err, &snooze) {
		t.Fatalf("a task at the account's quota: %v, want a snooze", err)
	}
	if run, _, _ := h.result(t, runID); run.Status != store.RunQueued || h.rt.Creates() != creates {
		t.Fatalf("run %s and %d creates after the snooze, want QUEUED and none", run.Status, h.rt.Creates()-creates)
	}
	// Setup may go one beyond the quota: the account waits for it.
	setupID, err := h.svc.Setup(ctx, h.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	if run, _, msg := h.finished(t, setupID); run.Status != store.RunCompleted {
		t.Fatalf("setup at the quota: %s %q", run.Status, msg)
	}
	// After waiting long enough the task fails with the quota's message.
	h.mu.Lock()
	h.later = taskQuotaWait + time.Minute
	h.mu.Unlock()
	run, _, msg := h.finished(t, runID)
	if run.Status != store.RunFailed || !strings.Contains(msg, "account has 1 active sandboxes") {
		t.Fatalf("run %s %q after the wait, want FAILED with the quota", run.Status, msg)
	}
}

// TestFinishedTaskRedeliveredAtTheQuota: a finished run's job delivered
// again while the account is at its quota completes at once; it does not
// wait, snoozed, for a place it will never use.
func TestFinishedTaskRedeliveredAtTheQuota(t *testing.T) {
	h := newHarness(t, options{settings: sandbox.Settings{PerAccount: 1}})
	ctx := context.Background()
	runID, err := h.svc.CodingAgent(ctx, h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if run, _, msg := h.finished(t, runID); run.Status != store.RunCompleted {
		t.Fatalf("run %s %q", run.Status, msg)
	}
	if _, _, err := h.mgr.Create(ctx, h.account.ID, sandbox.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := h.work(t, runID); err != nil {
		t.Fatalf("a finished run's job at the quota: %v, want done at once", err)
	}
}

// TestNoOperatorSecretReachesTheSandbox runs both tasks with an operator's
// GitHub token configured and model credentials in the server's own
// environment, then searches everything the sandboxes were given.
func TestNoOperatorSecretReachesTheSandbox(t *testing.T) {
	hostSecrets := map[string]string{
		"ANTHROPIC_API_KEY":       "sk-ant-HOST_SECRET_anthropic",
		"CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat-HOST_SECRET_oauth",
		"OPENAI_API_KEY":          "sk-HOST_SECRET_openai",
		"GITHUB_TOKEN":            "ghp_HOST_SECRET_github",
	}
	for k, v := range hostSecrets {
		t.Setenv(k, v)
	}
	h := newHarness(t, options{})
	ctx := context.Background()
	setupID, err := h.svc.Setup(ctx, h.account.ID)
	if err != nil {
		t.Fatal(err)
	}
	agentID, err := h.svc.CodingAgent(ctx, h.account.ID, sandbox.CodingAgentRequest{RepoURL: h.mirrorURL(), Prompt: "p", BaseBranch: "main"})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{setupID, agentID} {
		if run, _, msg := h.finished(t, id); run.Status != store.RunCompleted {
			t.Fatalf("run %s: %s %q", id, run.Status, msg)
		}
	}
	if len(h.github.pulls()) != 1 {
		t.Fatal("the pull request was not opened: the token was not used")
	}

	secrets := []string{operatorToken}
	for _, v := range hostSecrets {
		secrets = append(secrets, v)
	}
	// Everything a sandbox got: its environment, every process's command
	// line, environment and directory, every file written into it.
	var given []string
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.sandboxes) != 2 {
		t.Fatalf("%d task sandboxes ran processes, want 2", len(h.sandboxes))
	}
	for id, sb := range h.sandboxes {
		spec, _ := h.rt.Spec(id)
		given = append(given, spec.Env...)
		for p, b := range sb.Files() {
			given = append(given, p, string(b))
		}
		// The agent CLIs reach the models only through the proxy, with the
		// sandbox's own key.
		key := envValue(spec.Env, "RECOUP_API_KEY")
		if envValue(spec.Env, "ANTHROPIC_BASE_URL") != modelproxy.SandboxURL+"anthropic" || key == "" || envValue(spec.Env, "ANTHROPIC_API_KEY") != key {
			t.Errorf("sandbox %s: ANTHROPIC_BASE_URL %q, ANTHROPIC_API_KEY %q; want the proxy and the sandbox's own key", id,
				envValue(spec.Env, "ANTHROPIC_BASE_URL"), envValue(spec.Env, "ANTHROPIC_API_KEY"))
		}
		for _, kv := range spec.Env {
			k, v, _ := strings.Cut(kv, "=")
			if strings.Contains(v, "://") && !strings.Contains(v, "://sandboxd.internal") {
				t.Errorf("sandbox %s: %s names %q, not sandboxd.internal", id, k, v)
			}
		}
	}
	for _, e := range h.execs {
		given = append(given, e.req.Cmd...)
		given = append(given, e.req.Env...)
		given = append(given, e.req.Cwd)
	}
	for _, s := range given {
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("an operator secret reached a sandbox: %q", s)
			}
		}
	}
}

// TestClaudeCodeGetsThePromptVerbatim runs the real ralph-once.sh with the
// host's /bin/sh and a stand-in claude that prints its arguments: the
// prompt arrives as one argument after "--", whatever it holds.
func TestClaudeCodeGetsThePromptVerbatim(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Fatalf("no /bin/sh: %v", err)
	}
	bin := t.TempDir()
	fake := "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n"
	if err := os.WriteFile(filepath.Join(bin, "claude"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	rt := runtimefake.New()
	rt.SetExec(func(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		script, ok := sb.File(req.Cmd[1])
		if !ok || req.Cmd[0] != "/bin/sh" {
			return runtime.ExecResult{ExitCode: 127}, nil
		}
		path := filepath.Join(t.TempDir(), "ralph-once.sh")
		if err := os.WriteFile(path, script, 0o755); err != nil {
			return runtime.ExecResult{}, err
		}
		cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{path}, req.Cmd[2:]...)...)
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
		cmd.Stdout, cmd.Stderr = req.Stdout, req.Stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return runtime.ExecResult{ExitCode: ee.ExitCode()}, nil
		}
		return runtime.ExecResult{}, err
	})
	sb := rt.Add("sbx_prompt")
	for _, prompt := range []string{
		"plain words",
		"--dangerously-skip-permissions",
		"-p do something else",
		"two\nlines; $(touch /tmp/pwned) `id` \"$HOME\" '*'",
	} {
		var stdout strings.Builder
		code, err := RunClaudeCode(context.Background(), sb, "/workspace", prompt, &stdout, io.Discard)
		if err != nil || code != 0 {
			t.Fatalf("run: %d, %v", code, err)
		}
		got := strings.Split(strings.TrimSuffix(stdout.String(), "\x00"), "\x00")
		want := []string{"--model", "opus", "--permission-mode", "acceptEdits", "-p", "--", prompt}
		if !slices.Equal(got, want) {
			t.Fatalf("claude got %q, want %q", got, want)
		}
	}
}

// A failure to mirror or open the pull request is said in the run's
// output as the forge said it when it is the forge's refusal; anything
// else from the host (paths, git's output, network errors) stays in the
// server's log.
func TestForgeErrorText(t *testing.T) {
	h := newHarness(t, options{})
	refused := fmt.Errorf("create pull request: %w: Validation Failed: a pull request already exists", forge.ErrInvalid)
	if got := h.svc.forgeErrorText(t.Context(), "run_1", refused); got != refused.Error() {
		t.Errorf("the forge's refusal: %q, want it as it is", got)
	}
	hostErr := errors.New("repository of acc: open /var/lib/sandboxd/repos/acc.git/HEAD: permission denied")
	got := h.svc.forgeErrorText(t.Context(), "run_1", hostErr)
	if strings.Contains(got, "/var/lib") || !strings.Contains(got, "run_1") {
		t.Errorf("a host error: %q, want no host path and the run named", got)
	}
}
