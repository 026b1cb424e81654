package runs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// These tests run the run worker over a real SQLite store and River client
// with the in-memory sandboxes of runtimefake. host stands in for the
// sandbox manager at the boundary runs defines (runs.Host): a sandbox is
// local when the fake runtime holds it.

type host struct {
	rt           *runtimefake.Runtime
	setupPending bool
	prepareErr   error // what Prepare answers
	// traffic are the network counters Traffic answers, one per call (the
	// last one again once they run out); none: no network.
	traffic []netpol.Traffic
}

func (h *host) Local(ctx context.Context, sb store.Sandbox) (runtime.Sandbox, error) {
	if sb.Status != store.SandboxRunning {
		return nil, errors.New("not running")
	}
	return h.rt.Get(ctx, sb.ID)
}
func (h *host) Prepare(context.Context, store.Sandbox, runtime.Sandbox, bool) error {
	return h.prepareErr
}
func (h *host) SetupPending(context.Context, string) bool { return h.setupPending }
func (h *host) ExecDefaults(context.Context, store.Sandbox) (string, string, error) {
	return "", "", nil
}

func (h *host) TrafficOf(context.Context, store.Sandbox) (*netpol.Traffic, error) {
	if len(h.traffic) == 0 {
		return nil, nil
	}
	tr := h.traffic[0]
	if len(h.traffic) > 1 {
		h.traffic = h.traffic[1:]
	}
	return &tr, nil
}

type fixture struct {
	st      *store.Store
	jc      *jobs.Client
	rt      *runtimefake.Runtime
	host    *host
	runner  *runs.Runner
	account store.Account
	dataDir string
}

func newFixture(t *testing.T, cfg runs.Config) *fixture {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { jc.Close() })
	f := &fixture{st: st, jc: jc, rt: runtimefake.New(), dataDir: t.TempDir()}
	f.host = &host{rt: f.rt}
	cfg.Store, cfg.Jobs, cfg.Host, cfg.NodeID, cfg.DataDir = st, jc, f.host, "here", f.dataDir
	f.runner = runs.New(cfg)
	f.account = store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &f.account); err != nil {
		t.Fatal(err)
	}
	return f
}

// enqueue makes a running sandbox with a run of command.
func (f *fixture) enqueue(t *testing.T, command string, args ...string) (store.Sandbox, string) {
	t.Helper()
	ctx := context.Background()
	sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: f.account.ID, NodeID: "here", Status: store.SandboxRunning, Runtime: "fake", Deadline: time.Now().Add(time.Hour)}
	if err := f.st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	f.rt.Add(sb.ID)
	runID, err := runs.Enqueue(ctx, f.st, f.jc, sb, command, args, "", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return sb, runID
}

func (f *fixture) result(t *testing.T, runID string) (store.Run, map[string]any, string) {
	t.Helper()
	run, err := f.st.GetRun(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if len(run.Output) > 0 {
		if err := json.Unmarshal(run.Output, &out); err != nil {
			t.Fatal(err)
		}
	}
	var e struct{ Message string }
	_ = json.Unmarshal(run.Error, &e)
	return run, out, e.Message
}

func TestRunWaitsForSetup(t *testing.T) {
	f := newFixture(t, runs.Config{})
	f.host.setupPending = true
	_, runID := f.enqueue(t, "true")
	err := f.runner.Run(context.Background(), runID)
	var snooze *river.JobSnoozeError
	if !errors.As(err, &snooze) {
		t.Fatalf("a run while the account's setup is pending: %v, want a snooze", err)
	}
	if run, _, _ := f.result(t, runID); run.Status != store.RunQueued {
		t.Fatalf("run is %s, want still QUEUED", run.Status)
	}
}

func TestRunLogIsCappedAndSaysSo(t *testing.T) {
	f := newFixture(t, runs.Config{LogMaxBytes: 64 << 10})
	f.rt.SetExec(func(ctx context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		line := strings.Repeat("y", 1023) + "\n"
		for range 1024 { // 1 MiB, 16 times the cap
			if _, err := io.WriteString(req.Stdout, line); err != nil {
				return runtime.ExecResult{}, err
			}
		}
		return runtime.ExecResult{}, nil
	})
	_, runID := f.enqueue(t, "yes")
	if err := f.runner.Run(context.Background(), runID); err != nil {
		t.Fatal(err)
	}
	run, out, _ := f.result(t, runID)
	if run.Status != store.RunCompleted || out["logTruncated"] != true || out["logDroppedBytes"].(float64) < 900<<10 {
		t.Fatalf("run %s, output log fields %v %v", run.Status, out["logTruncated"], out["logDroppedBytes"])
	}
	fi, err := os.Stat(runs.LogPath(f.dataDir, runID))
	if err != nil || fi.Size() > 64<<10 {
		t.Fatalf("run log %v (%v), want at most the cap", fi, err)
	}
}

// TestRunLogsOfAnAccountAreBounded: every run's log is capped, but an
// account may start runs without end; only the logs of its newest runs are
// kept, so its runs cannot fill the data dir one capped log at a time. A
// run still executing and another account's runs keep theirs.
func TestRunLogsOfAnAccountAreBounded(t *testing.T) {
	securitytest.Attack(t, "logs",
		"one account starts 40 runs in a row, each printing 16 times --log-max-mib, to fill DATA_DIR/runs one capped log at a time",
		"only the logs of the account's newest runs.KeptRunLogs runs are kept: DATA_DIR/runs stays under that many caps; a run still executing and another account's run keep their logs")
	const capBytes = 64 << 10
	f := newFixture(t, runs.Config{LogMaxBytes: capBytes})
	ctx := context.Background()
	f.rt.SetExec(func(ctx context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		_, err := io.Copy(req.Stdout, io.LimitReader(zeros{}, 16*capBytes))
		return runtime.ExecResult{}, err
	})
	t0 := time.Now().Add(-time.Hour)
	enqueue := func(account string, at time.Time) string { t.Helper(); return f.enqueueAt(t, account, "yes", at) }
	// Another account's run, and one of this account's that is still
	// executing (its log exists, it has not ended), both older than all.
	bob := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &bob); err != nil {
		t.Fatal(err)
	}
	bobs := enqueue(bob.ID, t0)
	if err := f.runner.Run(ctx, bobs); err != nil {
		t.Fatal(err)
	}
	executing := enqueue(f.account.ID, t0.Add(time.Second))
	if ok, err := f.st.StartRun(ctx, executing, time.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := os.WriteFile(runs.LogPath(f.dataDir, executing), []byte("still running\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	var ids []string
	for i := range 40 {
		id := enqueue(f.account.ID, t0.Add(time.Duration(i+2)*time.Second))
		if err := f.runner.Run(ctx, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	entries, err := os.ReadDir(filepath.Dir(runs.LogPath(f.dataDir, "x")))
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	logs := map[string]bool{}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
		if id, ok := strings.CutSuffix(e.Name(), ".log"); ok {
			logs[id] = true
		}
	}
	// The newest KeptRunLogs of this account, the executing one and bob's.
	if want := runs.KeptRunLogs + 2; len(logs) != want {
		t.Errorf("%d run logs kept, want %d", len(logs), want)
	}
	for _, id := range append(ids[len(ids)-runs.KeptRunLogs:], executing, bobs) {
		if !logs[id] {
			t.Errorf("the log of run %s is gone", id)
		}
	}
	if limit := int64(runs.KeptRunLogs+2) * (capBytes + 4<<10); total > limit {
		t.Errorf("DATA_DIR/runs holds %d bytes after 40 runs, want at most %d", total, limit)
	}
	t.Logf("DATA_DIR/runs holds %d KiB in %d files after 40 runs of 1 MiB each", total>>10, len(entries))
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestPrepareErrorsKeepHostPathsInTheLog: a run whose workspace could not
// be prepared says so in its stderr, with what the sandbox's git said but
// never the host's error, which names its paths.
func TestPrepareErrorsKeepHostPathsInTheLog(t *testing.T) {
	securitytest.Attack(t, "api",
		"a run starts while its account's repository cannot be prepared on the host (an error naming DATA_DIR/repos), to read host paths from the run's stderr",
		"the run's stderr says preparing /workspace failed and that the details are in the server log; the host's error is not in the output; a failure of git inside the sandbox is given as is")
	for _, c := range []struct {
		err        error
		want, deny string
	}{
		{errors.New("ensure repository of acc: git init /var/lib/sandboxd/repos/acc.git: no space left on device"),
			"sandboxd: preparing /workspace failed: details are in the server log\n", "/var/lib"},
		{fmt.Errorf("prepare /workspace of sbx: %w", errdefs.New(nil, "exit status 128: fatal: repository not found")),
			"sandboxd: preparing /workspace failed: prepare /workspace of sbx: exit status 128: fatal: repository not found\n", ""},
	} {
		f := newFixture(t, runs.Config{})
		f.host.prepareErr = c.err
		_, runID := f.enqueue(t, "true")
		if err := f.runner.Run(context.Background(), runID); err != nil {
			t.Fatal(err)
		}
		run, out, _ := f.result(t, runID)
		stderr, _ := out["stderr"].(string)
		if run.Status != store.RunCompleted || stderr != c.want || (c.deny != "" && strings.Contains(string(run.Output), c.deny)) {
			t.Errorf("run %s, stderr %q, want %q", run.Status, stderr, c.want)
		}
	}
}

// TestRunOutputHasTrafficAndOOM: a run in a sandbox with a network reports
// what its network carried while the command ran, and an OOM kill.
func TestRunOutputHasTrafficAndOOM(t *testing.T) {
	f := newFixture(t, runs.Config{})
	f.host.traffic = []netpol.Traffic{{TxBytes: 100, RxBytes: 50}, {TxBytes: 1100, RxBytes: 2050}}
	f.rt.SetExec(func(context.Context, *runtimefake.Sandbox, runtime.ExecRequest) (runtime.ExecResult, error) {
		return runtime.ExecResult{ExitCode: 137, Signal: 9, OOMKilled: true}, nil
	})
	_, runID := f.enqueue(t, "hog")
	if err := f.runner.Run(context.Background(), runID); err != nil {
		t.Fatal(err)
	}
	_, out, _ := f.result(t, runID)
	if fmt.Sprint(out["networkBytes"]) != "map[received:2000 sent:1000]" || out["oomKilled"] != true {
		t.Fatalf("output %v: want networkBytes {sent 1000, received 2000} and oomKilled", out)
	}

	// Without a network, neither appears.
	g := newFixture(t, runs.Config{})
	_, runID = g.enqueue(t, "true")
	if err := g.runner.Run(context.Background(), runID); err != nil {
		t.Fatal(err)
	}
	if _, out, _ := g.result(t, runID); out["networkBytes"] != nil || out["oomKilled"] != nil {
		t.Fatalf("output without a network: %v", out)
	}
}

// TestRunOutputIsText: a run's command is told it has no terminal
// (NO_COLOR, FORCE_COLOR=0, TERM=dumb), and what it prints for one anyway
// (colours, a title, a spinner's erase, cut across writes) is stored as
// plain text, in the run's output and in its log.
func TestRunOutputIsText(t *testing.T) {
	f := newFixture(t, runs.Config{})
	var env []string
	f.rt.SetExec(func(_ context.Context, _ *runtimefake.Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error) {
		env = req.Env
		for _, w := range []struct {
			w io.Writer
			s string
		}{
			{req.Stdout, "\x1b]0;opencode\x07\x1b[1;3"}, {req.Stdout, "2mdone\x1b[0m\n"},
			{req.Stderr, "\x1b[31mError:\x1b[39m no provider\r\x1b[2K\n"},
		} {
			if _, err := io.WriteString(w.w, w.s); err != nil {
				return runtime.ExecResult{}, err
			}
		}
		return runtime.ExecResult{ExitCode: 1}, nil
	})
	_, runID := f.enqueue(t, "opencode", "run", "hi")
	if err := f.runner.Run(context.Background(), runID); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"NO_COLOR=1", "FORCE_COLOR=0", "TERM=dumb"} {
		if !slices.Contains(env, want) {
			t.Errorf("the command's environment %q lacks %s", env, want)
		}
	}
	run, out, _ := f.result(t, runID)
	if run.Status != store.RunCompleted || out["stdout"] != "done\n" || out["stderr"] != "Error: no provider\r\n" || out["exitCode"] != 1.0 {
		t.Fatalf("run %s, output %q", run.Status, out)
	}
	log, err := os.ReadFile(runs.LogPath(f.dataDir, runID))
	if err != nil || string(log) != "[stdout] done\n[stderr] Error: no provider\r\n" {
		t.Fatalf("run log %q (%v)", log, err)
	}
}

func TestOpenCodeConfigNamesOnlyTheProxy(t *testing.T) {
	f := newFixture(t, runs.Config{Model: runs.ModelProvider{BaseURL: "https://models.example.test/v1", Model: "m1"}})
	sb, runID := f.enqueue(t, "opencode", "run", "hello")
	if err := f.runner.Run(context.Background(), runID); err != nil {
		t.Fatal(err)
	}
	rsb, _ := f.rt.Get(context.Background(), sb.ID)
	cfg, ok := rsb.(*runtimefake.Sandbox).File("/workspace/opencode.json")
	if !ok {
		t.Fatal("no opencode.json written")
	}
	if s := string(cfg); !strings.Contains(s, "http://sandboxd.internal/model/openai") || !strings.Contains(s, "{env:RECOUP_API_KEY}") || strings.Contains(s, "models.example.test") {
		t.Fatalf("opencode.json %s: want the proxy and the sandbox's key only", s)
	}
}

// TestReconcileTakesUpOnlyThisNodesExecutingRuns: this node's executing run
// is followed again in the background; the fake runtime keeps no process
// for it to find, so it ends CRASHED (the command is gone). Another node's
// run and a queued one are left alone.
func TestReconcileTakesUpOnlyThisNodesExecutingRuns(t *testing.T) {
	f := newFixture(t, runs.Config{})
	ctx := context.Background()
	_, here := f.enqueue(t, "sleep")
	_, queued := f.enqueue(t, "sleep")
	other := store.Sandbox{ID: store.NewID("sbx_"), AccountID: f.account.ID, NodeID: "elsewhere", Status: store.SandboxRunning, Runtime: "fake", Deadline: time.Now().Add(time.Hour)}
	if err := f.st.CreateSandbox(ctx, &other); err != nil {
		t.Fatal(err)
	}
	there, err := runs.Enqueue(ctx, f.st, f.jc, other, "sleep", nil, "", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{here, there} {
		if ok, err := f.st.StartRun(ctx, id, time.Now()); err != nil || !ok {
			t.Fatalf("start %s: %v %v", id, ok, err)
		}
	}
	if err := f.runner.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		run, _, msg := f.result(t, here)
		if run.Status == store.RunCrashed {
			if !strings.Contains(msg, "the command is gone") {
				t.Errorf("crashed run's message %q", msg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s is %s (%q), want CRASHED", here, run.Status, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for id, want := range map[string]store.RunStatus{queued: store.RunQueued, there: store.RunExecuting} {
		if run, _, msg := f.result(t, id); run.Status != want {
			t.Errorf("run %s is %s (%q), want %s", id, run.Status, msg, want)
		}
	}
}

func TestRecordWritesTheRunsShape(t *testing.T) {
	f := newFixture(t, runs.Config{})
	_, runID := f.enqueue(t, "true")
	if ok, err := f.st.StartRun(context.Background(), runID, time.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	if err := runs.Record(context.Background(), f.st, runID, store.RunFailed, map[string]any{"k": 1}, "it broke", time.Now()); err != nil {
		t.Fatal(err)
	}
	run, out, msg := f.result(t, runID)
	if run.Status != store.RunFailed || fmt.Sprint(out["k"]) != "1" || msg != "it broke" {
		t.Fatalf("run %s, output %v, error %q", run.Status, out, msg)
	}
}

// TestRunRecordsOfAnAccountAreBounded: an account may start runs without
// end, each with up to 512 KiB of output in its record; only the records of
// its newest runs are kept. A run still executing and another account's
// runs keep theirs.
func TestRunRecordsOfAnAccountAreBounded(t *testing.T) {
	securitytest.Attack(t, "database",
		"one account starts runs without end, each storing up to 512 KiB of output in the shared database",
		"only the records of the account's newest runs.KeptRunRecords runs are kept; a run still executing and another account's runs keep theirs")
	const kept = 5
	f := newFixture(t, runs.Config{KeptRecords: kept})
	ctx := context.Background()
	t0 := time.Now().Add(-time.Hour)
	enqueue := func(account string, at time.Time) string { t.Helper(); return f.enqueueAt(t, account, "true", at) }
	bob := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &bob); err != nil {
		t.Fatal(err)
	}
	bobs := enqueue(bob.ID, t0)
	if err := f.runner.Run(ctx, bobs); err != nil {
		t.Fatal(err)
	}
	executing := enqueue(f.account.ID, t0.Add(time.Second))
	if ok, err := f.st.StartRun(ctx, executing, time.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	var ids []string
	for i := range 12 {
		id := enqueue(f.account.ID, t0.Add(time.Duration(i+2)*time.Second))
		if err := f.runner.Run(ctx, id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for _, id := range append(ids[len(ids)-kept:], executing, bobs) {
		if _, err := f.st.GetRun(ctx, id); err != nil {
			t.Errorf("run %s should be kept: %v", id, err)
		}
	}
	for _, id := range ids[:len(ids)-kept] {
		if _, err := f.st.GetRun(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("run %s should be gone: %v", id, err)
		}
	}
}

// enqueueAt queues a run of command for account, created at, in a running
// sandbox of its own.
func (f *fixture) enqueueAt(t *testing.T, account, command string, at time.Time) string {
	t.Helper()
	ctx := context.Background()
	sb := store.Sandbox{ID: store.NewID("sbx_"), AccountID: account, NodeID: "here", Status: store.SandboxRunning, Runtime: "fake", Deadline: time.Now().Add(time.Hour)}
	if err := f.st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	f.rt.Add(sb.ID)
	runID, err := runs.Enqueue(ctx, f.st, f.jc, sb, command, nil, "", at)
	if err != nil {
		t.Fatal(err)
	}
	return runID
}
