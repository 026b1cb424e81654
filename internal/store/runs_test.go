package store_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestCreateRun(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")

		tests := []struct {
			name string
			in   *store.Run
			want error
		}{
			{"defaults", &store.Run{AccountID: alice.ID, Task: "setup-sandbox"}, nil},
			{"full", &store.Run{ID: "run_full", AccountID: alice.ID, SandboxID: "sb-gone", Task: "run-sandbox-command",
				Status: store.RunCompleted, Payload: json.RawMessage(`{"command":"ls","args":["-l"]}`),
				Output: json.RawMessage(`{"exitCode":0,"stdout":"ünïcode\n"}`), Error: json.RawMessage(`{"message":"x"}`),
				Tags: []string{"account:" + alice.ID, "x"}, CreatedAt: t0, UpdatedAt: t0.Add(time.Second),
				StartedAt: ptr(t0), FinishedAt: ptr(t0.Add(time.Second))}, nil},
			{"duplicate id", &store.Run{ID: "run_full", AccountID: alice.ID, Task: "t"}, store.ErrConflict},
			{"unknown account", &store.Run{AccountID: "missing", Task: "t"}, store.ErrNotFound},
			{"unknown status", &store.Run{AccountID: alice.ID, Task: "t", Status: "DONE"}, store.ErrInvalid},
			{"payload not JSON", &store.Run{AccountID: alice.ID, Task: "t", Payload: json.RawMessage(`{nope`)}, store.ErrInvalid},
			{"output not JSON", &store.Run{AccountID: alice.ID, Task: "t", Output: json.RawMessage(`nope`)}, store.ErrInvalid},
			{"nil", nil, store.ErrInvalid},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := s.CreateRun(ctx, tt.in)
				wantErr(t, "CreateRun", err, tt.want)
				if err != nil {
					return
				}
				got, err := s.GetRun(ctx, tt.in.ID)
				if err != nil {
					t.Fatal(err)
				}
				if !runEqual(got, *tt.in) {
					t.Fatalf("GetRun = %+v\nwant %+v", got, *tt.in)
				}
			})
		}
		def := tests[0].in
		if !strings.HasPrefix(def.ID, "run_") || def.Status != store.RunQueued || def.Tags == nil || string(def.Payload) != "null" ||
			def.CreatedAt.IsZero() || def.UpdatedAt != def.CreatedAt {
			t.Errorf("defaults not filled: %+v", def)
		}
		_, err := s.GetRun(ctx, "missing")
		wantErr(t, "GetRun(missing)", err, store.ErrNotFound)
	})
}

func runEqual(a, b store.Run) bool {
	tp := func(x, y *time.Time) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.ID == b.ID && a.AccountID == b.AccountID && a.SandboxID == b.SandboxID && a.Task == b.Task && a.Status == b.Status &&
		string(a.Payload) == string(b.Payload) && string(a.Output) == string(b.Output) && string(a.Error) == string(b.Error) &&
		slices.Equal(a.Tags, b.Tags) && a.CreatedAt == b.CreatedAt && a.UpdatedAt == b.UpdatedAt &&
		tp(a.StartedAt, b.StartedAt) && tp(a.FinishedAt, b.FinishedAt)
}

func TestRunLifecycle(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		var runs []store.Run
		for i, acct := range []string{alice.ID, alice.ID, bob.ID, alice.ID} {
			r := store.Run{AccountID: acct, Task: "coding-agent", Payload: json.RawMessage(`{}`), CreatedAt: t0.Add(time.Duration(i) * time.Second)}
			if err := s.CreateRun(ctx, &r); err != nil {
				t.Fatal(err)
			}
			runs = append(runs, r)
		}
		id := func(r store.Run) string { return r.ID }

		steps := []struct {
			name       string
			do         func() (bool, error)
			want       bool
			wantErr    error
			run        int
			wantStatus store.RunStatus
		}{
			{"start", func() (bool, error) { return s.StartRun(ctx, runs[0].ID, t0.Add(time.Minute)) }, true, nil, 0, store.RunExecuting},
			{"start twice", func() (bool, error) { return s.StartRun(ctx, runs[0].ID, t0.Add(2*time.Minute)) }, false, nil, 0, store.RunExecuting},
			{"start missing", func() (bool, error) { return s.StartRun(ctx, "missing", t0) }, false, store.ErrNotFound, 0, store.RunExecuting},
			{"finish with non-final status", func() (bool, error) {
				return s.FinishRun(ctx, runs[0].ID, store.RunExecuting, nil, nil, t0)
			}, false, store.ErrInvalid, 0, store.RunExecuting},
			{"finish with bad output", func() (bool, error) {
				return s.FinishRun(ctx, runs[0].ID, store.RunCompleted, json.RawMessage("{"), nil, t0)
			}, false, store.ErrInvalid, 0, store.RunExecuting},
			{"finish executing", func() (bool, error) {
				return s.FinishRun(ctx, runs[0].ID, store.RunCompleted, json.RawMessage(`{"exitCode":0}`), nil, t0.Add(3*time.Minute))
			}, true, nil, 0, store.RunCompleted},
			{"finish twice", func() (bool, error) {
				return s.FinishRun(ctx, runs[0].ID, store.RunFailed, nil, json.RawMessage(`{"message":"late"}`), t0.Add(4*time.Minute))
			}, false, nil, 0, store.RunCompleted},
			{"start finished", func() (bool, error) { return s.StartRun(ctx, runs[0].ID, t0) }, false, nil, 0, store.RunCompleted},
			{"cancel queued", func() (bool, error) {
				return s.FinishRun(ctx, runs[1].ID, store.RunCanceled, nil, json.RawMessage(`{"message":"canceled"}`), t0.Add(time.Minute))
			}, true, nil, 1, store.RunCanceled},
			{"finish missing", func() (bool, error) { return s.FinishRun(ctx, "missing", store.RunCrashed, nil, nil, t0) }, false, store.ErrNotFound, 1, store.RunCanceled},
			{"start bob's", func() (bool, error) { return s.StartRun(ctx, runs[2].ID, t0.Add(time.Minute)) }, true, nil, 2, store.RunExecuting},
		}
		for _, tt := range steps {
			got, err := tt.do()
			wantErr(t, tt.name, err, tt.wantErr)
			if got != tt.want {
				t.Fatalf("%s = %v, want %v", tt.name, got, tt.want)
			}
			r, err := s.GetRun(ctx, runs[tt.run].ID)
			if err != nil || r.Status != tt.wantStatus {
				t.Fatalf("%s: status %q (%v), want %q", tt.name, r.Status, err, tt.wantStatus)
			}
		}

		r0, _ := s.GetRun(ctx, runs[0].ID)
		if *r0.StartedAt != t0ms.Add(time.Minute) || *r0.FinishedAt != t0ms.Add(3*time.Minute) || r0.UpdatedAt != *r0.FinishedAt ||
			string(r0.Output) != `{"exitCode":0}` || r0.Error != nil {
			t.Errorf("finished run: %+v started %v finished %v", r0, r0.StartedAt, r0.FinishedAt)
		}
		r1, _ := s.GetRun(ctx, runs[1].ID)
		if r1.StartedAt != nil || *r1.FinishedAt != t0ms.Add(time.Minute) || string(r1.Error) != `{"message":"canceled"}` || r1.Output != nil {
			t.Errorf("canceled run: %+v", r1)
		}

		lists := []struct {
			account string
			limit   int
			want    []string
		}{
			{alice.ID, 0, []string{runs[3].ID, runs[1].ID, runs[0].ID}},
			{alice.ID, 2, []string{runs[3].ID, runs[1].ID}},
			{bob.ID, 10, []string{runs[2].ID}},
			{"", 0, []string{runs[3].ID, runs[2].ID, runs[1].ID, runs[0].ID}},
			{"missing", 0, []string{}},
		}
		for _, tt := range lists {
			got, err := s.ListRuns(ctx, tt.account, tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(got, id); !slices.Equal(g, tt.want) {
				t.Errorf("ListRuns(%q, %d) = %v, want %v", tt.account, tt.limit, g, tt.want)
			}
		}

		byStatus := []struct {
			statuses []store.RunStatus
			want     []string
		}{
			{[]store.RunStatus{store.RunQueued, store.RunExecuting}, []string{runs[2].ID, runs[3].ID}},
			{[]store.RunStatus{store.RunCompleted}, []string{runs[0].ID}},
			{[]store.RunStatus{store.RunCrashed}, []string{}},
			{nil, []string{runs[0].ID, runs[1].ID, runs[2].ID, runs[3].ID}},
		}
		for _, tt := range byStatus {
			got, err := s.ListRunsByStatus(ctx, tt.statuses...)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(got, id); !slices.Equal(g, tt.want) {
				t.Errorf("ListRunsByStatus(%v) = %v, want %v", tt.statuses, g, tt.want)
			}
		}
	})
}

// TestFinishedRunsPast: the runs whose logs package runs deletes are the
// account's finished ones past its newest skip, on both dialects.
func TestFinishedRunsPast(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		t0 := time.Now().Add(-time.Hour)
		var ids []string // oldest first
		for i := range 6 {
			r := store.Run{AccountID: alice.ID, Task: "run-sandbox-command", CreatedAt: t0.Add(time.Duration(i) * time.Second)}
			if err := s.CreateRun(ctx, &r); err != nil {
				t.Fatal(err)
			}
			if i != 1 { // the second oldest is still queued
				if _, err := s.FinishRun(ctx, r.ID, store.RunCompleted, nil, nil, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			ids = append(ids, r.ID)
		}
		other := store.Run{AccountID: bob.ID, Task: "run-sandbox-command", CreatedAt: t0}
		if err := s.CreateRun(ctx, &other); err != nil {
			t.Fatal(err)
		}
		if _, err := s.FinishRun(ctx, other.ID, store.RunCompleted, nil, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		got, err := s.FinishedRunsPast(ctx, alice.ID, 3, 10)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{ids[2], ids[0]}; !slices.Equal(got, want) {
			t.Fatalf("finished runs past the newest 3: %v, want %v", got, want)
		}
		if got, err := s.FinishedRunsPast(ctx, alice.ID, 3, 1); err != nil || !slices.Equal(got, []string{ids[2]}) {
			t.Fatalf("within a window of 1: %v %v", got, err)
		}
	})
}

// TestRunSandboxLinks: a task's run is given its sandbox once; a list of
// sandboxes learns each one's newest run in one query.
func TestRunSandboxLinks(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		a := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		b := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		idle := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		run := func(sandboxID string, at time.Time) store.Run {
			r := store.Run{AccountID: alice.ID, SandboxID: sandboxID, Task: "run-sandbox-command", CreatedAt: at}
			if err := s.CreateRun(ctx, &r); err != nil {
				t.Fatal(err)
			}
			return r
		}
		run(a.ID, t0)
		newest := run(a.ID, t0.Add(time.Minute))
		run(a.ID, t0.Add(time.Second))
		task := run("", t0)
		if ok, err := s.SetRunSandbox(ctx, task.ID, b.ID); !ok || err != nil {
			t.Fatalf("SetRunSandbox: %v, %v", ok, err)
		}
		if ok, err := s.SetRunSandbox(ctx, task.ID, a.ID); ok || err != nil {
			t.Fatalf("SetRunSandbox again: %v, %v; want false, the first one kept", ok, err)
		}
		if _, err := s.SetRunSandbox(ctx, "run_none", a.ID); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("SetRunSandbox of no run: %v", err)
		}
		got, err := s.LatestRunIDs(ctx, []string{a.ID, b.ID, idle.ID})
		if err != nil || len(got) != 2 || got[a.ID] != newest.ID || got[b.ID] != task.ID {
			t.Fatalf("LatestRunIDs = %v (%v), want %s for a, %s for b, none for idle", got, err, newest.ID, task.ID)
		}
	})
}
