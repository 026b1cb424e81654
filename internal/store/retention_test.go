package store_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/migrations"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestDeleteEndedSandboxes: only sandboxes that ended before the cutoff
// go, in batches, with their keys and E2B records; live, paused, stopping
// and recently ended ones stay, as do ended ones a queued or executing run
// still names or another row still refers to.
func TestDeleteEndedSandboxes(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		securitytest.Attack(t, "database", "an account's ended sandboxes pile up without end, while the retention sweep must never delete a live, paused or stopping sandbox, or one a run or another row still needs",
			"ended sandboxes past the cutoff are deleted in bounded batches with their keys and E2B records; every other row stays")
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		cutoff := t0.Add(7 * 24 * time.Hour)
		ended := func(status store.SandboxStatus, at time.Time) store.Sandbox {
			t.Helper()
			sb := store.Sandbox{AccountID: alice.ID, NodeID: "n1", Status: status, Runtime: "gvisor", CreatedAt: t0, Deadline: t0, StoppedAt: &at}
			if err := s.CreateSandbox(ctx, &sb); err != nil {
				t.Fatal(err)
			}
			return sb
		}
		var old []store.Sandbox
		for i := range 5 {
			status := store.SandboxStopped
			if i%2 == 1 {
				status = store.SandboxFailed
			}
			old = append(old, ended(status, t0.Add(time.Duration(i)*time.Minute)))
		}
		atCutoff := ended(store.SandboxStopped, cutoff)
		recent := ended(store.SandboxStopped, cutoff.Add(time.Millisecond))
		running := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		pending := mustSandbox(t, s, alice.ID, "n1", store.SandboxPending, t0)
		stopping := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopping, t0)
		paused := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		if ok, err := s.BeginPause(ctx, paused.ID, t0); !ok || err != nil {
			t.Fatalf("BeginPause = %v, %v", ok, err)
		}
		// An ended sandbox whose run still waits for its worker, and
		// one whose run finished.
		waited := ended(store.SandboxStopped, t0)
		for _, r := range []store.Run{
			{AccountID: alice.ID, SandboxID: waited.ID, Task: "run-sandbox-command", Status: store.RunQueued},
			{AccountID: alice.ID, SandboxID: old[0].ID, Task: "run-sandbox-command", Status: store.RunCompleted, FinishedAt: &t0},
		} {
			if err := s.CreateRun(ctx, &r); err != nil {
				t.Fatal(err)
			}
		}
		// What the schema cascades to goes with the sandbox.
		if err := s.CreateE2BSandbox(ctx, store.E2BSandbox{SandboxID: old[1].ID, AccountID: alice.ID, TemplateID: "base", AccessToken: "tok", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateAPIKey(ctx, &store.APIKey{AccountID: alice.ID, Prefix: "sbx_x", Hash: "h1", SandboxID: old[2].ID}); err != nil {
			t.Fatal(err)
		}
		// A table of another feature that refers to a sandbox without a
		// cascade: the schema says that row must stay.
		if _, err := s.DB().ExecContext(ctx, "CREATE TABLE holds (sandbox_id TEXT NOT NULL REFERENCES sandboxes (id))"); err != nil {
			t.Fatal(err)
		}
		insert := "INSERT INTO holds (sandbox_id) VALUES (?)"
		if s.Dialect() == store.DialectPostgres {
			insert = "INSERT INTO holds (sandbox_id) VALUES ($1)"
		}
		if _, err := s.DB().ExecContext(ctx, insert, old[3].ID); err != nil {
			t.Fatal(err)
		}

		// Batches of 2 pass over the held sandbox and the one whose run
		// waits, and go on to the end.
		total := sweepAll(t, 2, func(from store.Cursor, limit int) (int, store.Cursor, error) {
			return s.DeleteEndedSandboxes(ctx, cutoff, from, limit)
		})
		// old minus the held one, and the one that ended at the cutoff.
		if total != 5 {
			t.Fatalf("deleted %d sandboxes in all, want 5", total)
		}
		if n := sweepAll(t, 100, func(from store.Cursor, limit int) (int, store.Cursor, error) {
			return s.DeleteEndedSandboxes(ctx, cutoff, from, limit)
		}); n != 0 {
			t.Fatalf("a second sweep deleted %d; want nothing left to delete", n)
		}
		for _, sb := range []store.Sandbox{old[0], old[1], old[2], old[4], atCutoff} {
			if _, err := s.GetSandbox(ctx, sb.ID); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("sandbox %s (%s) is still there: %v", sb.ID, sb.Status, err)
			}
		}
		for name, sb := range map[string]store.Sandbox{"recent": recent, "running": running, "pending": pending, "stopping": stopping,
			"paused": paused, "run waiting": waited, "held": old[3]} {
			if _, err := s.GetSandbox(ctx, sb.ID); err != nil {
				t.Errorf("%s sandbox %s: %v", name, sb.ID, err)
			}
		}
		if _, err := s.GetE2BSandbox(ctx, old[1].ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("E2B record of a deleted sandbox: %v, want not found", err)
		}
		if _, err := s.GetAPIKeyByHash(ctx, "h1"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("key of a deleted sandbox: %v, want not found", err)
		}
		// Runs are history: the finished run of a deleted sandbox stays.
		if runs, _ := s.ListRuns(ctx, alice.ID, 0); len(runs) != 2 {
			t.Errorf("%d runs left, want both", len(runs))
		}
	})
}

// TestDeleteRunsFinishedBefore: finished runs older than the cutoff go,
// in batches; queued and executing runs never do, however old.
func TestDeleteRunsFinishedBefore(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		securitytest.Attack(t, "database", "an account's finished runs (each up to 512 KiB of output) pile up without end, while the retention sweep must never delete a run still queued or executing",
			"finished runs past the cutoff are deleted in bounded batches; queued and executing runs stay whatever their age")
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		cutoff := t0.Add(30 * 24 * time.Hour)
		run := func(status store.RunStatus, finished *time.Time) string {
			t.Helper()
			r := store.Run{AccountID: alice.ID, Task: "t", Status: status, CreatedAt: t0, FinishedAt: finished, Payload: json.RawMessage(`{}`)}
			if err := s.CreateRun(ctx, &r); err != nil {
				t.Fatal(err)
			}
			return r.ID
		}
		var gone []string
		for i, st := range []store.RunStatus{store.RunCompleted, store.RunFailed, store.RunCrashed, store.RunCanceled} {
			gone = append(gone, run(st, ptr(t0.Add(time.Duration(i)*time.Hour))))
		}
		gone = append(gone, run(store.RunCompleted, &cutoff))
		kept := []string{
			run(store.RunCompleted, ptr(cutoff.Add(time.Millisecond))),
			run(store.RunQueued, nil),
			run(store.RunExecuting, nil),
		}
		total := sweepAll(t, 2, func(from store.Cursor, limit int) (int, store.Cursor, error) {
			return s.DeleteRunsFinishedBefore(ctx, cutoff, from, limit)
		})
		if total != len(gone) {
			t.Fatalf("deleted %d runs, want %d", total, len(gone))
		}
		left, err := s.ListRuns(ctx, alice.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		got := ids(left, func(r store.Run) string { return r.ID })
		slices.Sort(got)
		slices.Sort(kept)
		if !slices.Equal(got, kept) {
			t.Fatalf("runs left %v, want %v", got, kept)
		}
		missing, err := s.MissingRuns(ctx, append([]string{kept[0]}, gone...))
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(missing)
		slices.Sort(gone)
		if !slices.Equal(missing, gone) {
			t.Fatalf("MissingRuns = %v, want the deleted %v", missing, gone)
		}
	})
}

// sweepAll runs batches of limit until the sweep reached the end and says
// how many rows went in all; no batch may delete more than limit.
func sweepAll(t *testing.T, limit int, batch func(from store.Cursor, limit int) (int, store.Cursor, error)) int {
	t.Helper()
	total := 0
	from := store.Cursor{}
	for range 100 {
		n, next, err := batch(from, limit)
		if err != nil {
			t.Fatal(err)
		}
		if n > limit {
			t.Fatalf("a batch of %d deleted %d", limit, n)
		}
		total += n
		if next.IsZero() {
			return total
		}
		from = next
	}
	t.Fatal("the sweep never reached the end")
	return 0
}

// TestRetentionMigrationBackfills: rows that ended without their end time
// (before 00012_retention) are given their last update as that time, so
// that the sweep, which goes by it, finds them.
func TestRetentionMigrationBackfills(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		sb := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopped, t0)
		live := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		r := store.Run{AccountID: alice.ID, Task: "t", Status: store.RunCompleted, CreatedAt: t0}
		if err := s.CreateRun(ctx, &r); err != nil {
			t.Fatal(err)
		}
		dialect := goose.DialectSQLite3
		if s.Dialect() == store.DialectPostgres {
			dialect = goose.DialectPostgres
		}
		p, err := goose.NewProvider(dialect, s.DB(), migrations.FS, goose.WithDisableGlobalRegistry(true))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.DownTo(ctx, 11); err != nil {
			t.Fatalf("undo 00012: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = storetest.Open(t, dsn) // applies 00012 again
		if got, err := s.GetSandbox(ctx, sb.ID); err != nil || got.StoppedAt == nil || !got.StoppedAt.Equal(got.UpdatedAt) {
			t.Errorf("stopped sandbox without stopped_at: %+v, %v; want its updated_at", got, err)
		}
		if got, err := s.GetSandbox(ctx, live.ID); err != nil || got.StoppedAt != nil {
			t.Errorf("running sandbox: %+v, %v; want no stopped_at", got, err)
		}
		if got, err := s.GetRun(ctx, r.ID); err != nil || got.FinishedAt == nil || !got.FinishedAt.Equal(got.UpdatedAt) {
			t.Errorf("finished run without finished_at: %+v, %v; want its updated_at", got, err)
		}
	})
}

// TestFailureReasonMigration: a sandbox failed with its node before 00013
// named the node's id in its reason; the migration words it for the user.
// Other reasons stay as they are.
func TestFailureReasonMigration(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		lost := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		crashed := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		for id, reason := range map[string]string{
			lost.ID:    "its node 3ae6588d-60be-4191-be04-e569261c934d stopped answering (no heartbeat for 31s)",
			crashed.ID: "the sandbox was gone after sandboxd restarted",
		} {
			if _, err := s.TransitionSandbox(ctx, id, []store.SandboxStatus{store.SandboxRunning}, store.SandboxFailed, reason, t0); err != nil {
				t.Fatal(err)
			}
		}
		dialect := goose.DialectSQLite3
		if s.Dialect() == store.DialectPostgres {
			dialect = goose.DialectPostgres
		}
		p, err := goose.NewProvider(dialect, s.DB(), migrations.FS, goose.WithDisableGlobalRegistry(true))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.DownTo(ctx, 12); err != nil {
			t.Fatalf("undo 00013: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s = storetest.Open(t, dsn) // applies 00013 again
		if got, _ := s.GetSandbox(ctx, lost.ID); got.FailureReason != "its node stopped answering; its processes and unsaved work are lost" {
			t.Errorf("reason of a sandbox lost with its node: %q", got.FailureReason)
		}
		if got, _ := s.GetSandbox(ctx, crashed.ID); got.FailureReason != "the sandbox was gone after sandboxd restarted" {
			t.Errorf("another reason changed: %q", got.FailureReason)
		}
	})
}
