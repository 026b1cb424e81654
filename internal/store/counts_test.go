package store_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestCountLiveSandboxes: a node's live sandboxes are counted by status,
// pause state and runtime; ended ones and other nodes' are not.
func TestCountLiveSandboxes(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		a := mustAccount(t, s, store.AccountPersonal, "counted")
		for _, status := range []store.SandboxStatus{store.SandboxPending, store.SandboxRunning, store.SandboxRunning, store.SandboxRunning, store.SandboxStopping, store.SandboxStopped, store.SandboxFailed} {
			mustSandbox(t, s, a.ID, "n1", status, t0)
		}
		mustSandbox(t, s, a.ID, "n2", store.SandboxRunning, t0)
		paused := mustSandbox(t, s, a.ID, "n1", store.SandboxRunning, t0)
		if ok, err := s.BeginPause(ctx, paused.ID, t0); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if ok, err := s.TransitionPause(ctx, paused.ID, []string{store.PausePausing}, store.PausePaused, t0); !ok || err != nil {
			t.Fatal(ok, err)
		}
		got, err := s.CountLiveSandboxes(ctx, "n1")
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(a, b store.SandboxCount) int {
			return strings.Compare(string(a.Status)+a.Pause, string(b.Status)+b.Pause)
		})
		want := []store.SandboxCount{
			{Status: store.SandboxPending, Runtime: "gvisor", N: 1},
			{Status: store.SandboxRunning, Runtime: "gvisor", N: 3},
			{Status: store.SandboxRunning, Pause: store.PausePaused, Runtime: "gvisor", N: 1},
			{Status: store.SandboxStopping, Runtime: "gvisor", N: 1},
		}
		if !slices.Equal(got, want) {
			t.Fatalf("counts %+v, want %+v", got, want)
		}
	})
}

// TestCountRuns: queued and executing runs are counted whenever they
// started; finished ones only from since on.
func TestCountRuns(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		a := mustAccount(t, s, store.AccountPersonal, "runner")
		run := func(status store.RunStatus, finished time.Time) {
			t.Helper()
			r := store.Run{AccountID: a.ID, Task: "run-sandbox-command", Status: store.RunQueued, CreatedAt: t0}
			if err := s.CreateRun(ctx, &r); err != nil {
				t.Fatal(err)
			}
			switch status {
			case store.RunQueued:
			case store.RunExecuting:
				if ok, err := s.StartRun(ctx, r.ID, t0); !ok || err != nil {
					t.Fatal(ok, err)
				}
			default:
				if ok, err := s.FinishRun(ctx, r.ID, status, nil, nil, finished); !ok || err != nil {
					t.Fatal(ok, err)
				}
			}
		}
		since := t0.Add(time.Hour)
		run(store.RunQueued, time.Time{})
		run(store.RunExecuting, time.Time{})
		run(store.RunExecuting, time.Time{})
		run(store.RunCompleted, since)
		run(store.RunCompleted, since.Add(time.Minute))
		run(store.RunCompleted, since.Add(-time.Millisecond))
		run(store.RunFailed, since.Add(time.Second))
		got, err := s.CountRuns(ctx, since)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(a, b store.RunCount) int { return strings.Compare(string(a.Status), string(b.Status)) })
		want := []store.RunCount{{store.RunCompleted, 2}, {store.RunExecuting, 2}, {store.RunFailed, 1}, {store.RunQueued, 1}}
		if !slices.Equal(got, want) {
			t.Fatalf("counts %+v, want %+v", got, want)
		}
	})
}
