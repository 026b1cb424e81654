package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// These tests drive the control plane (the Manager over a real SQLite
// store and a real River client) against the in-memory runtime of package
// runtimefake: no root, no runsc, seconds. The runtime is a fake at a
// process boundary the manager does not own; everything else is real.

// plane is a manager on node "here" with one account.
type plane struct {
	m       *Manager
	rt      *runtimefake.Runtime
	st      *store.Store
	auth    *auth.Authenticator
	account store.Account
}

func newPlane(t *testing.T, settings Settings, hooks ...Hook) *plane {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jc.Close() })
	acct := store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &acct); err != nil {
		t.Fatal(err)
	}
	rt := runtimefake.New()
	hooks = append([]Hook{NewKeyHook(KeyHookConfig{Store: st})}, hooks...)
	m := NewManager(Config{Store: st, Runtime: rt, Jobs: jc, NodeID: "here", DataDir: t.TempDir(), Settings: settings, Hooks: hooks})
	return &plane{m: m, rt: rt, st: st, auth: auth.NewAuthenticator(st), account: acct}
}

// sandboxKey is the RECOUP_API_KEY the runtime was given for id.
func (p *plane) sandboxKey(t *testing.T, id string) string {
	t.Helper()
	spec, ok := p.rt.Spec(id)
	if !ok {
		t.Fatalf("the runtime never created %s", id)
	}
	for _, kv := range spec.Env {
		if k, ok := strings.CutPrefix(kv, "RECOUP_API_KEY="); ok {
			return k
		}
	}
	t.Fatalf("no RECOUP_API_KEY in %s's environment", id)
	return ""
}

func (p *plane) status(t *testing.T, id string) store.Sandbox {
	t.Helper()
	sb, err := p.st.GetSandbox(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func (p *plane) keyWorks(id, key string) bool {
	k, err := p.auth.Authenticate(context.Background(), key)
	return err == nil && k.SandboxID == id
}

func TestCreateRecordsAndStarts(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	sb, runID, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil || runID != "" {
		t.Fatalf("create: %v (run %q)", err, runID)
	}
	if sb.Status != store.SandboxRunning || p.status(t, sb.ID).Status != store.SandboxRunning {
		t.Fatalf("status %s / %s, want running", sb.Status, p.status(t, sb.ID).Status)
	}
	if got := sb.Deadline.Sub(sb.CreatedAt); got != time.Minute {
		t.Fatalf("lifetime %s, want the requested 1m", got)
	}
	if !p.keyWorks(sb.ID, p.sandboxKey(t, sb.ID)) {
		t.Fatal("the sandbox's key does not authenticate as the sandbox")
	}
	// A lifetime past the maximum is refused before anything exists.
	_, _, err = p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: 25 * time.Hour})
	if !errors.Is(err, errdefs.ErrInvalid) || p.rt.Creates() != 1 {
		t.Fatalf("create past the max timeout: %v, %d creates", err, p.rt.Creates())
	}
}

// TestPromptNeedsAModel: a prompt on a server with no model is refused at
// once, naming the flags that configure one, and starts nothing; with a
// model (a provider that is never called: the fake runtime runs nothing)
// it starts its run.
func TestPromptNeedsAModel(t *testing.T) {
	ctx := context.Background()
	p := newPlane(t, Settings{})
	_, runID, err := p.m.Create(ctx, p.account.ID, CreateRequest{Prompt: "say hi"})
	if !errors.Is(err, errdefs.ErrInvalid) || runID != "" || p.rt.Creates() != 0 {
		t.Fatalf("prompt without a model: %v (run %q, %d creates), want a refusal before anything starts", err, runID, p.rt.Creates())
	}
	for _, flag := range []string{"--model-base-url", "--model NAME"} {
		if msg := errdefs.Message(err, ""); !strings.Contains(msg, flag) {
			t.Errorf("refusal %q does not name %s", msg, flag)
		}
	}
	// Half a model is none: the message names what is missing.
	p = newPlane(t, Settings{Model: runs.ModelProvider{BaseURL: "http://models.invalid/v1"}})
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Prompt: "say hi"}); !errors.Is(err, errdefs.ErrInvalid) ||
		strings.Contains(err.Error(), "--model-base-url") || !strings.Contains(err.Error(), "--model NAME") {
		t.Fatalf("prompt with a base URL and no model name: %v", err)
	}
	p = newPlane(t, Settings{Model: runs.ModelProvider{BaseURL: "http://models.invalid/v1", Model: "m"}})
	if _, runID, err := p.m.Create(ctx, p.account.ID, CreateRequest{Prompt: "say hi"}); err != nil || runID == "" {
		t.Fatalf("prompt with a model: %v (run %q)", err, runID)
	}
}

func TestCreateFailureLeavesAFailedRowAndNoKey(t *testing.T) {
	p := newPlane(t, Settings{})
	boom := errors.New("no space for the image")
	var key string
	p.rt.FailCreate(func(spec runtime.Spec) error {
		for _, kv := range spec.Env {
			if k, ok := strings.CutPrefix(kv, "RECOUP_API_KEY="); ok {
				key = k
			}
		}
		return boom
	})
	sb, _, err := p.m.Create(context.Background(), p.account.ID, CreateRequest{})
	if !errors.Is(err, boom) {
		t.Fatalf("create: %v, want the runtime's error", err)
	}
	got := p.status(t, sb.ID)
	if got.Status != store.SandboxFailed || got.FailureReason != reasonStartGeneric {
		t.Fatalf("row %s %q, want failed with the reason", got.Status, got.FailureReason)
	}
	if key == "" || p.keyWorks(sb.ID, key) {
		t.Fatalf("the key minted for the failed sandbox still works (%q)", key)
	}
	if ids, _ := p.rt.List(context.Background()); len(ids) != 0 {
		t.Fatalf("runtime holds %v after a failed create", ids)
	}
}

func TestConcurrentCreatesKeepTheQuota(t *testing.T) {
	const quota, calls = 3, 12
	p := newPlane(t, Settings{PerAccount: quota})
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		ok     int
		quotas int
		start  = make(chan struct{})
	)
	for range calls {
		wg.Go(func() {
			<-start
			_, _, err := p.m.Create(context.Background(), p.account.ID, CreateRequest{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errdefs.ErrQuota):
				quotas++
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	if ok != quota || quotas != calls-quota || p.rt.Creates() != quota {
		t.Fatalf("%d created, %d refused, %d in the runtime; want %d, %d, %d", ok, quotas, p.rt.Creates(), quota, calls-quota, quota)
	}
}

func TestStopIsOnceAndRevokes(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	key := p.sandboxKey(t, sb.ID)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := p.m.stopByRequest(ctx, sb); err != nil {
				t.Errorf("stop: %v", err)
			}
		})
	}
	wg.Wait()
	got := p.status(t, sb.ID)
	if got.Status != store.SandboxStopped || got.FailureReason != "stopped by request" {
		t.Fatalf("row %s %q, want stopped by request", got.Status, got.FailureReason)
	}
	if n := p.rt.Destroys(sb.ID); n != 1 {
		t.Fatalf("destroyed %d times, want once", n)
	}
	if p.keyWorks(sb.ID, key) {
		t.Fatal("the key of a stopped sandbox still works")
	}
	// Stopping a stopped sandbox is not an error and changes nothing.
	if _, err := p.m.stopByRequest(ctx, got); err != nil || p.status(t, sb.ID).Status != store.SandboxStopped {
		t.Fatalf("second stop: %v, %s", err, p.status(t, sb.ID).Status)
	}
}

func TestReaperStopsAtTheDeadline(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	short, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	long, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	p.m.reap(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for p.status(t, short.ID).Status != store.SandboxStopped {
		if time.Now().After(deadline) {
			t.Fatalf("expired sandbox is %s", p.status(t, short.ID).Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := p.status(t, short.ID).FailureReason; r != store.ReasonTimeout {
		t.Fatalf("reason %q, want %q", r, store.ReasonTimeout)
	}
	if s := p.status(t, long.ID).Status; s != store.SandboxRunning {
		t.Fatalf("a sandbox before its deadline is %s", s)
	}
}

// TestReconcileMatrix restarts the control plane over each combination of
// a row's status and what the runtime holds, as a crash leaves them.
func TestReconcileMatrix(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	row := func(status store.SandboxStatus) store.Sandbox {
		sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: p.account.ID, NodeID: "here", Status: status, Runtime: "fake", Deadline: time.Now().Add(time.Hour)}
		if err := p.st.CreateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		return sb
	}
	cases := []struct {
		name    string
		status  store.SandboxStatus
		runtime string // "running", "stopped" (its processes died), "gone"
		want    store.SandboxStatus
		kept    bool // still on the runtime afterwards
	}{
		{"running and alive", store.SandboxRunning, "running", store.SandboxRunning, true},
		{"running, died meanwhile", store.SandboxRunning, "stopped", store.SandboxFailed, false},
		{"running, lost with the host", store.SandboxRunning, "gone", store.SandboxFailed, false},
		{"pending", store.SandboxPending, "running", store.SandboxFailed, false},
		{"pending, never created", store.SandboxPending, "gone", store.SandboxFailed, false},
		{"stopping", store.SandboxStopping, "running", store.SandboxStopped, false},
		{"stopping, already destroyed", store.SandboxStopping, "gone", store.SandboxStopped, false},
		{"stopped, left on the host", store.SandboxStopped, "running", store.SandboxStopped, false},
		{"failed, left on the host", store.SandboxFailed, "stopped", store.SandboxFailed, false},
	}
	ids := make([]string, len(cases))
	for i, tc := range cases {
		sb := row(tc.status)
		ids[i] = sb.ID
		switch tc.runtime {
		case "running":
			p.rt.Add(sb.ID)
		case "stopped":
			p.rt.Add(sb.ID)
			p.rt.Kill(sb.ID)
		}
	}
	orphan := p.rt.Add("sbx_without_a_row")
	// A run executing at the crash, in a sandbox that survived, and one
	// still queued.
	executing := store.Run{ID: store.NewID("run_"), AccountID: p.account.ID, SandboxID: ids[0], Task: jobs.KindRunCommand, Status: store.RunQueued, Payload: json.RawMessage(`{"command":"sleep"}`)}
	queued := store.Run{ID: store.NewID("run_"), AccountID: p.account.ID, SandboxID: ids[0], Task: jobs.KindRunCommand, Status: store.RunQueued, Payload: json.RawMessage(`{"command":"true"}`)}
	for _, r := range []*store.Run{&executing, &queued} {
		if err := p.st.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := p.st.StartRun(ctx, executing.ID, time.Now()); err != nil || !ok {
		t.Fatalf("start run: %v %v", ok, err)
	}

	if err := p.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	for i, tc := range cases {
		got := p.status(t, ids[i])
		_, err := p.rt.Get(ctx, ids[i])
		if got.Status != tc.want || (err == nil) != tc.kept {
			t.Errorf("%s: row %s (%q), on the runtime %v; want %s, %v", tc.name, got.Status, got.FailureReason, err == nil, tc.want, tc.kept)
		}
	}
	if _, err := p.rt.Get(ctx, orphan.ID()); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("a runtime sandbox without a row survived reconcile: %v", err)
	}
	for _, want := range []struct {
		id     string
		status store.RunStatus
	}{{executing.ID, store.RunCrashed}, {queued.ID, store.RunQueued}} {
		// An executing run of a running sandbox is followed again in the
		// background; the fake runtime keeps no process, so it crashes.
		deadline := time.Now().Add(5 * time.Second)
		for {
			r, err := p.st.GetRun(ctx, want.id)
			if err == nil && r.Status == want.status {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("run %s is %s (%v), want %s", want.id, r.Status, err, want.status)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// runOf creates a sandbox with a command and runs its job the way the
// worker would, returning the finished run and its decoded output.
func (p *plane) runOf(t *testing.T, command string) (store.Run, map[string]any) {
	t.Helper()
	ctx := context.Background()
	_, runID, err := p.m.Create(ctx, p.account.ID, CreateRequest{Command: command, Args: []string{"x"}})
	if err != nil || runID == "" {
		t.Fatalf("create with a command: %v %q", err, runID)
	}
	if err := p.m.runs.Run(ctx, runID); err != nil {
		t.Fatalf("run: %v", err)
	}
	run, err := p.st.GetRun(ctx, runID)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if len(run.Output) > 0 {
		if err := json.Unmarshal(run.Output, &out); err != nil {
			t.Fatalf("output %s: %v", run.Output, err)
		}
	}
	return run, out
}

func errorMessage(run store.Run) string {
	var e struct{ Message string }
	_ = json.Unmarshal(run.Error, &e)
	return e.Message
}

func TestRunStatuses(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	var stopSelf func(sb *runtimefake.Sandbox)
	p.rt.SetExec(func(ctx context.Context, sb *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		switch req.Cmd[0] {
		case "exit3":
			fmt.Fprint(req.Stdout, "partial")
			fmt.Fprint(req.Stderr, "oops")
			return runtime.ExecResult{ExitCode: 3}, nil
		case "missing":
			return runtime.ExecResult{ExitCode: 127}, runtime.ErrCommandNotFound
		case "agentdies":
			return runtime.ExecResult{}, io.ErrUnexpectedEOF
		case "timesout":
			fmt.Fprint(req.Stdout, "before the deadline")
			stopSelf(sb)
			return runtime.ExecResult{ExitCode: 137, Signal: 9}, nil
		}
		return runtime.ExecResult{}, nil
	})
	stopSelf = func(sb *runtimefake.Sandbox) {
		row := p.status(t, sb.ID())
		if err := p.m.stop(context.Background(), row, store.ReasonTimeout); err != nil {
			t.Errorf("stop at the deadline: %v", err)
		}
	}

	t.Run("a command that ran is COMPLETED whatever its exit code", func(t *testing.T) {
		run, out := p.runOf(t, "exit3")
		if run.Status != store.RunCompleted || out["exitCode"] != 3.0 || out["stdout"] != "partial" || out["stderr"] != "oops" {
			t.Fatalf("run %s, output %v", run.Status, out)
		}
		// The job handed out again (after a crash, say) does not run the
		// command twice: only a QUEUED run starts.
		sb, _ := p.rt.Get(ctx, run.SandboxID)
		before := len(sb.(*runtimefake.Sandbox).Execs())
		if err := p.m.runs.Run(ctx, run.ID); err != nil {
			t.Fatal(err)
		}
		if after := len(sb.(*runtimefake.Sandbox).Execs()); after != before {
			t.Fatalf("a finished run's job ran the command again (%d → %d execs)", before, after)
		}
	})
	t.Run("a missing command is FAILED with 127", func(t *testing.T) {
		run, out := p.runOf(t, "missing")
		if run.Status != store.RunFailed || out["exitCode"] != 127.0 || errorMessage(run) != "command not found: missing" {
			t.Fatalf("run %s %q, output %v", run.Status, errorMessage(run), out)
		}
	})
	t.Run("an agent that fails mid-run is CRASHED", func(t *testing.T) {
		run, _ := p.runOf(t, "agentdies")
		if run.Status != store.RunCrashed || !strings.Contains(errorMessage(run), "could not be run to completion") {
			t.Fatalf("run %s %q", run.Status, errorMessage(run))
		}
	})
	t.Run("a run cut by the deadline is FAILED with the partial output", func(t *testing.T) {
		run, out := p.runOf(t, "timesout")
		if run.Status != store.RunFailed || !strings.Contains(errorMessage(run), "reached its timeout") || out["stdout"] != "before the deadline" {
			t.Fatalf("run %s %q, output %v", run.Status, errorMessage(run), out)
		}
	})
	t.Run("a run whose sandbox ended before it started is FAILED", func(t *testing.T) {
		sb, runID, err := p.m.Create(ctx, p.account.ID, CreateRequest{Command: "exit3"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.m.stopByRequest(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := p.m.runs.Run(ctx, runID); err != nil {
			t.Fatal(err)
		}
		run, _ := p.st.GetRun(ctx, runID)
		if run.Status != store.RunFailed || !strings.Contains(errorMessage(run), "before the command could start") {
			t.Fatalf("run %s %q", run.Status, errorMessage(run))
		}
	})
}

func TestDiskAdmission(t *testing.T) {
	const gib = int64(1) << 30
	p := newPlane(t, Settings{Limits: runtime.Limits{DiskBytes: 4 * gib}, DiskReserveBytes: gib, WarmSandboxes: 1})
	free := 14 * gib
	p.m.diskFreeFn = func(string) (int64, error) { return free, nil }
	ctx := context.Background()
	// 14 free - 1 reserved - 4 for the warm sandbox: room for two.
	var made []store.Sandbox
	for range 2 {
		sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
		if err != nil {
			t.Fatalf("create within the disk: %v", err)
		}
		made = append(made, sb)
	}
	_, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
	if !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "cannot hold another sandbox of 4096 MiB") {
		t.Fatalf("create beyond the disk: %v", err)
	}
	// What a sandbox already wrote is out of free and no longer owed:
	// filling one does not change the balance.
	rsb, _ := p.rt.Get(ctx, made[0].ID)
	if err := rsb.WriteFile(ctx, "/big", strings.NewReader(strings.Repeat("x", 1<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	free -= 1 << 20
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{}); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("create after a sandbox wrote: %v", err)
	}
	// A stop gives the place back.
	if _, err := p.m.stopByRequest(ctx, made[1]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{}); err != nil {
		t.Fatalf("create after a stop: %v", err)
	}
}

// TestNetworkNeedsTheCapability: a runtime without sandbox networks (the
// microVM backend today) refuses a network at once, before any row,
// namespace or sandbox exists.
func TestNetworkNeedsTheCapability(t *testing.T) {
	p := newPlane(t, Settings{})
	p.rt.SetCapabilities(runtime.Capabilities{})
	ctx := context.Background()
	_, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Network: &netpol.Policy{Mode: netpol.ModeEgress}})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(errdefs.Message(err, ""), "the fake runtime of this server does not support sandbox networks yet") {
		t.Fatalf("create with a network: %v", err)
	}
	if rows, _ := p.st.ListSandboxes(ctx, p.account.ID); len(rows) != 0 || p.rt.Creates() != 0 {
		t.Fatalf("%d rows and %d creates after the refusal, want none", len(rows), p.rt.Creates())
	}
	// Without a network the same runtime serves the create.
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{}); err != nil {
		t.Fatal(err)
	}
}

// recordingHook is a concern plugged in through Config.Hooks: it adds a
// variable, may fail, and records its stop and reconcile calls.
type recordingHook struct {
	mu        sync.Mutex
	fail      bool
	stopped   []string
	reconcile []bool // keep(id) of the probed id at each reconcile
	probe     string
}

func (*recordingHook) Name() string          { return "recording" }
func (*recordingHook) FailureReason() string { return "the recording hook refused it" }
func (h *recordingHook) Prestart(_ context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail {
		return errors.New("refused")
	}
	spec.Env = append(spec.Env, "HOOKED="+sb.ID)
	return nil
}
func (h *recordingHook) Stop(_ context.Context, id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = append(h.stopped, id)
	return nil
}
func (h *recordingHook) Reconcile(_ context.Context, keep func(string) bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reconcile = append(h.reconcile, keep(h.probe))
	return nil
}

func TestHooks(t *testing.T) {
	h := &recordingHook{}
	p := newPlane(t, Settings{}, h)
	ctx := context.Background()
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := p.rt.Spec(sb.ID)
	if !slices.Contains(spec.Env, "HOOKED="+sb.ID) || p.sandboxKey(t, sb.ID) == "" {
		t.Fatalf("env %v: want the hook's variable after the key's", spec.Env)
	}
	// Reconcile tells the hook which sandboxes live.
	h.probe = sb.ID
	if err := p.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.stopByRequest(ctx, sb); err != nil {
		t.Fatal(err)
	}
	// A failing prestart fails the start with the hook's reason, and the
	// stop hooks undo what was made (the key minted before is revoked).
	h.fail = true
	failed, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
	if err == nil {
		t.Fatal("create with a failing hook succeeded")
	}
	if got := p.status(t, failed.ID); got.Status != store.SandboxFailed || got.FailureReason != "the recording hook refused it" {
		t.Fatalf("row %s %q", got.Status, got.FailureReason)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !slices.Equal(h.stopped, []string{sb.ID, failed.ID}) || !slices.Equal(h.reconcile, []bool{true}) {
		t.Fatalf("stop hook saw %v, reconcile %v", h.stopped, h.reconcile)
	}
	if n := p.rt.Creates(); n != 1 {
		t.Fatalf("%d creates, want the failed start to create nothing", n)
	}
}

// TestExecReportsOOMKill: an exec whose command the runtime reports killed
// for memory says so, with its exit code.
func TestExecReportsOOMKill(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	p.rt.SetExec(func(context.Context, *runtimefake.Sandbox, runtime.ExecRequest) (runtime.ExecResult, error) {
		return runtime.ExecResult{ExitCode: 137, Signal: 9, OOMKilled: true}, nil
	})
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.m.exec(ctx, sb, ExecRequest{Command: "hog"}, io.Discard, io.Discard)
	if err != nil || res != (ExecResult{ExitCode: 137, OOMKilled: true}) {
		t.Fatalf("exec: %+v, %v; want exit 137, OOMKilled", res, err)
	}
}
