package retention_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/retention"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// t0 is when the test's world begins; the sweeper's clock is moved from
// there.
var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// world is an account with sandboxes and runs that ended at known times,
// and the run logs of a node.
type world struct {
	st      *store.Store
	logs    runs.Logs
	account store.Account
}

func newWorld(t *testing.T, dsn string) *world {
	t.Helper()
	w := &world{st: storetest.Open(t, dsn), logs: runs.Logs{DataDir: t.TempDir()}}
	w.account = store.Account{Name: "alice", Kind: store.AccountPersonal, CreatedAt: t0}
	if err := w.st.CreateAccount(t.Context(), &w.account); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(w.logs.DataDir, "runs"), 0o700); err != nil {
		t.Fatal(err)
	}
	return w
}

// sandbox inserts a sandbox of status that ended at ended (nil: has not).
func (w *world) sandbox(t *testing.T, status store.SandboxStatus, ended *time.Time) string {
	t.Helper()
	sb := store.Sandbox{AccountID: w.account.ID, NodeID: "n1", Status: status, Runtime: "gvisor", CreatedAt: t0, Deadline: t0.Add(time.Hour), StoppedAt: ended}
	if err := w.st.CreateSandbox(t.Context(), &sb); err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

// run inserts a run of status that finished at finished (nil: has not),
// with a log on the node.
func (w *world) run(t *testing.T, status store.RunStatus, finished *time.Time) string {
	t.Helper()
	r := store.Run{AccountID: w.account.ID, Task: "run-sandbox-command", Status: status, CreatedAt: t0, FinishedAt: finished}
	if err := w.st.CreateRun(t.Context(), &r); err != nil {
		t.Fatal(err)
	}
	w.log(t, r.ID)
	return r.ID
}

// log writes a log and its .pos file for run id.
func (w *world) log(t *testing.T, id string) {
	t.Helper()
	for _, p := range []string{runs.LogPath(w.logs.DataDir, id), runs.LogPath(w.logs.DataDir, id) + ".pos"} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func (w *world) sandboxExists(t *testing.T, id string) bool {
	t.Helper()
	_, err := w.st.GetSandbox(t.Context(), id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func (w *world) runExists(t *testing.T, id string) bool {
	t.Helper()
	_, err := w.st.GetRun(t.Context(), id)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

func (w *world) logIDs(t *testing.T) []string {
	t.Helper()
	ids, err := w.logs.RunIDs()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return ids
}

func at(d time.Duration) *time.Time {
	v := t0.Add(d)
	return &v
}

const day = 24 * time.Hour

// TestSweep: as the clock moves on, each sweep deletes what ended longer
// ago than its keep, with the logs of the runs that went, and nothing
// else: live, paused and stopping sandboxes, queued and executing runs
// and their logs stay however old they are.
func TestSweep(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		securitytest.Attack(t, "database", "an account's stopped sandboxes and finished runs (rows, E2B records, run logs on the node's disk) accumulate for as long as it uses the server",
			"a sweep on every node deletes stopped sandboxes after --keep-stopped-sandboxes and finished runs with their logs after --keep-finished-runs, in bounded batches; live, paused and stopping sandboxes and unfinished runs stay")
		w := newWorld(t, dsn)
		ctx := t.Context()
		stoppedDay1 := w.sandbox(t, store.SandboxStopped, at(day))
		failedDay3 := w.sandbox(t, store.SandboxFailed, at(3*day))
		running := w.sandbox(t, store.SandboxRunning, nil)
		stopping := w.sandbox(t, store.SandboxStopping, nil)
		paused := w.sandbox(t, store.SandboxRunning, nil)
		if ok, err := w.st.BeginPause(ctx, paused, t0); !ok || err != nil {
			t.Fatalf("BeginPause = %v, %v", ok, err)
		}
		runDay1 := w.run(t, store.RunCompleted, at(day))
		runDay3 := w.run(t, store.RunFailed, at(3*day))
		queued := w.run(t, store.RunQueued, nil)
		executing := w.run(t, store.RunExecuting, nil)
		w.log(t, "run_deletedwithitsaccount") // a log whose run has no row

		now := t0
		sw, err := retention.New(retention.Config{Store: w.st, Logs: w.logs, KeepSandboxes: 7 * day, KeepRuns: 30 * day,
			Batch: 1, MaxBatches: 10, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		sweep := func(want retention.Result) {
			t.Helper()
			got, err := sw.Sweep(ctx)
			if err != nil || got != want {
				t.Fatalf("sweep at %v = %+v, %v; want %+v", now.Sub(t0), got, err, want)
			}
		}

		sweep(retention.Result{Logs: 1}) // only the orphan log
		now = t0.Add(8 * day)            // the day-1 sandbox is 7 days gone
		sweep(retention.Result{Sandboxes: 1})
		if w.sandboxExists(t, stoppedDay1) || !w.sandboxExists(t, failedDay3) {
			t.Fatal("after 8 days: want the sandbox stopped on day 1 gone, the one failed on day 3 kept")
		}
		now = t0.Add(31 * day)
		sweep(retention.Result{Sandboxes: 1, Runs: 1, Logs: 1})
		if w.runExists(t, runDay1) || !w.runExists(t, runDay3) {
			t.Fatal("after 31 days: want the run finished on day 1 gone, the one on day 3 kept")
		}
		now = t0.Add(3650 * day)
		sweep(retention.Result{Runs: 1, Logs: 1})
		sweep(retention.Result{}) // idempotent
		for name, id := range map[string]string{"running": running, "stopping": stopping, "paused": paused} {
			if !w.sandboxExists(t, id) {
				t.Errorf("%s sandbox deleted", name)
			}
		}
		for name, id := range map[string]string{"queued": queued, "executing": executing} {
			if !w.runExists(t, id) {
				t.Errorf("%s run deleted", name)
			}
		}
		want := []string{queued, executing}
		slices.Sort(want)
		if got := w.logIDs(t); !slices.Equal(got, want) {
			t.Fatalf("logs left %v, want those of the unfinished runs %v", got, want)
		}
	})
}

// TestSweepKeepsForever: a zero keep deletes nothing of its kind; the logs
// of runs without a row still go.
func TestSweepKeepsForever(t *testing.T) {
	w := newWorld(t, storetest.SQLiteDSN(t))
	sb := w.sandbox(t, store.SandboxStopped, at(0))
	run := w.run(t, store.RunCompleted, at(0))
	w.log(t, "run_gone")
	sw, err := retention.New(retention.Config{Store: w.st, Logs: w.logs, Now: func() time.Time { return t0.Add(3650 * day) }})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := sw.Sweep(t.Context()); err != nil || got != (retention.Result{Logs: 1}) {
		t.Fatalf("Sweep = %+v, %v; want only the orphan log", got, err)
	}
	if !w.sandboxExists(t, sb) || !w.runExists(t, run) || !slices.Equal(w.logIDs(t), []string{run}) {
		t.Fatal("a keep of 0 deleted something")
	}
	if _, err := retention.New(retention.Config{Store: w.st, KeepRuns: -time.Hour}); err == nil {
		t.Fatal("a negative keep was accepted")
	}
}

// TestSweepBounded: one sweep runs at most MaxBatches batches of each kind;
// the next sweep carries on.
func TestSweepBounded(t *testing.T) {
	w := newWorld(t, storetest.SQLiteDSN(t))
	for range 5 {
		w.sandbox(t, store.SandboxStopped, at(0))
	}
	sw, err := retention.New(retention.Config{Store: w.st, KeepSandboxes: day, Batch: 2, MaxBatches: 2, Now: func() time.Time { return t0.Add(2 * day) }})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []int{4, 1, 0} {
		if got, err := sw.Sweep(t.Context()); err != nil || got.Sandboxes != want {
			t.Fatalf("Sweep = %+v, %v; want %d sandboxes", got, err, want)
		}
	}
}
