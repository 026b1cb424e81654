package store_test

import (
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// race runs n calls of fn at once and returns how many succeeded and how
// many failed with ErrQuota; any other error fails the test.
func race(t *testing.T, n int, fn func(i int) error) (ok, over int) {
	t.Helper()
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			err := fn(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, store.ErrQuota):
				var qe *store.QuotaError
				if !errors.As(err, &qe) || qe.Limit == 0 {
					t.Errorf("quota error without its figures: %v", err)
				}
				over++
			default:
				t.Errorf("call %d: %v", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	return ok, over
}

func TestCreateSandboxWithinIsAtomic(t *testing.T) {
	securitytest.Attack(t, "quotas", "13 (and 20) simultaneous sandbox inserts of one account race the per-account and per-node counts",
		"count and insert are one locked transaction: exactly the limit succeeds on SQLite and PostgreSQL, the rest are ErrQuota")
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		newSB := func(account string) *store.Sandbox {
			return &store.Sandbox{AccountID: account, NodeID: "n1", Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
		}
		tests := []struct {
			name    string
			account string
			calls   int
			lim     store.SandboxLimits
			want    int // successes
		}{
			{"per account", alice.ID, 13, store.SandboxLimits{PerAccount: 5}, 5},
			{"per node, other account", bob.ID, 20, store.SandboxLimits{PerAccount: 100, PerNode: 9}, 4}, // 5 of Alice's already there
			{"unlimited", bob.ID, 3, store.SandboxLimits{}, 3},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				ok, over := race(t, tt.calls, func(int) error { return s.CreateSandboxWithin(ctx, newSB(tt.account), tt.lim) })
				if ok != tt.want || over != tt.calls-tt.want {
					t.Fatalf("%d succeeded and %d over quota, want %d and %d", ok, over, tt.want, tt.calls-tt.want)
				}
			})
		}
		// A stopped sandbox frees its place.
		list, err := s.ListSandboxes(ctx, alice.ID)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.TransitionSandbox(ctx, list[0].ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxStopped, "", time.Now()); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateSandboxWithin(ctx, newSB(alice.ID), store.SandboxLimits{PerAccount: 5}); err != nil {
			t.Fatalf("after a stop: %v", err)
		}
		// Inside a caller's transaction the check shares it.
		err = s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
			return q.CreateSandboxWithin(ctx, newSB(alice.ID), store.SandboxLimits{PerAccount: 5})
		})
		if !errors.Is(err, store.ErrQuota) {
			t.Fatalf("in a transaction at the limit: %v, want ErrQuota", err)
		}
	})
}

// TestCreateSandboxesWithinAllOrNone: a fork's children go in together or
// not at all, counted against the same limits.
func TestCreateSandboxesWithinAllOrNone(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		children := func(n int) []*store.Sandbox {
			sbs := make([]*store.Sandbox, n)
			for i := range sbs {
				sbs[i] = &store.Sandbox{AccountID: alice.ID, NodeID: "n1", Runtime: "gvisor", Deadline: time.Now().Add(time.Hour), ForkedFrom: "sbx_parent"}
			}
			return sbs
		}
		lim := store.SandboxLimits{PerAccount: 4}
		if err := s.CreateSandboxesWithin(ctx, children(3), lim); err != nil {
			t.Fatalf("3 of 4: %v", err)
		}
		if err := s.CreateSandboxesWithin(ctx, children(2), lim); !errors.Is(err, store.ErrQuota) {
			t.Fatalf("2 more past a limit of 4: %v, want ErrQuota", err)
		}
		list, err := s.ListSandboxes(ctx, alice.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 3 {
			t.Fatalf("%d sandboxes after a refused insert of 2, want 3: part of it went in", len(list))
		}
		if list[0].ForkedFrom != "sbx_parent" {
			t.Errorf("forked_from read back as %q", list[0].ForkedFrom)
		}
		if err := s.CreateSandboxesWithin(ctx, children(1), store.SandboxLimits{PerNode: 4}); err != nil {
			t.Fatalf("the last place on the node: %v", err)
		}
		mixed := append(children(1), &store.Sandbox{AccountID: alice.ID, NodeID: "n2", Runtime: "gvisor"})
		if err := s.CreateSandboxesWithin(ctx, mixed, store.SandboxLimits{}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("children on two nodes: %v, want ErrInvalid", err)
		}
	})
}

func TestCreateRunWithinIsAtomic(t *testing.T) {
	securitytest.Attack(t, "quotas", "12 simultaneous coding-agent runs of one account race the queued+executing count",
		"exactly the limit is recorded on SQLite and PostgreSQL; other tasks and finished runs do not count")
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		ok, over := race(t, 12, func(int) error {
			return s.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
				return q.CreateRunWithin(ctx, &store.Run{AccountID: alice.ID, Task: "coding-agent"}, 3)
			})
		})
		if ok != 3 || over != 9 {
			t.Fatalf("%d recorded and %d over quota, want 3 and 9", ok, over)
		}
		if err := s.CreateRunWithin(ctx, &store.Run{AccountID: alice.ID, Task: "setup-sandbox"}, 3); err != nil {
			t.Fatalf("another task: %v", err)
		}
		runs, err := s.ListRuns(ctx, alice.ID, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range runs {
			if r.Task == "coding-agent" {
				if _, err := s.FinishRun(ctx, r.ID, store.RunFailed, nil, nil, time.Now()); err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		if err := s.CreateRunWithin(ctx, &store.Run{AccountID: alice.ID, Task: "coding-agent"}, 3); err != nil {
			t.Fatalf("after one finished: %v", err)
		}
	})
}
