package jobs_test

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// holdArgs is a job that holds its worker until the test releases it.
type holdArgs struct {
	RunID string `json:"run_id"`
}

func (holdArgs) Kind() string { return "test-hold" }

type holdWorker struct {
	river.WorkerDefaults[holdArgs]
	release chan struct{}

	mu      sync.Mutex
	running map[string]int // by run id's account
	maxA    int
	started map[string]bool
	account map[string]string // run id -> account
}

func (w *holdWorker) Work(ctx context.Context, job *river.Job[holdArgs]) error {
	w.mu.Lock()
	acct := w.account[job.Args.RunID]
	w.running[acct]++
	if acct == "A" {
		w.maxA = max(w.maxA, w.running[acct])
	}
	w.started[job.Args.RunID] = true
	w.mu.Unlock()
	select {
	case <-w.release:
	case <-ctx.Done():
	}
	w.mu.Lock()
	w.running[acct]--
	w.mu.Unlock()
	return nil
}

func TestFairShareLetsAnotherAccountRun(t *testing.T) {
	securitytest.Attack(t, "quotas", "account A queues 40 long jobs on a node with 8 workers before account B queues one",
		"A never runs more than its share (3) at once and B's job starts while A's backlog waits")
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		ctx := t.Context()
		st := storetest.Open(t, dsn)
		w := &holdWorker{release: make(chan struct{}), running: map[string]int{}, started: map[string]bool{}, account: map[string]string{}}
		workers := river.NewWorkers()
		river.AddWorker(workers, w)
		jc, err := jobs.New(ctx, st, jobs.Config{NodeID: "n1", Workers: workers, Concurrency: 8, PerAccount: 3, PostgresDSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		accounts := map[string]string{}
		for _, name := range []string{"A", "B"} {
			a := store.Account{Name: name, Kind: store.AccountPersonal}
			if err := st.CreateAccount(ctx, &a); err != nil {
				t.Fatal(err)
			}
			accounts[name] = a.ID
		}
		enqueue := func(name string) string {
			r := store.Run{AccountID: accounts[name], Task: "test"}
			err := st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
				if err := q.CreateRun(ctx, &r); err != nil {
					return err
				}
				return jc.InsertTx(ctx, tx, holdArgs{RunID: r.ID}, "")
			})
			if err != nil {
				t.Fatal(err)
			}
			w.mu.Lock()
			w.account[r.ID] = name
			w.mu.Unlock()
			return r.ID
		}
		for range 40 {
			enqueue("A")
		}
		bRun := enqueue("B")
		if err := jc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer func() {
			close(w.release)
			stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = jc.Stop(stopCtx)
		}()
		deadline := time.Now().Add(20 * time.Second)
		for {
			w.mu.Lock()
			bStarted, maxA := w.started[bRun], w.maxA
			w.mu.Unlock()
			if maxA > 3 {
				t.Fatalf("account A ran %d jobs at once, its share is 3", maxA)
			}
			if bStarted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("account B's job did not start within 20 s while A has 40 queued (A at most %d at once)", maxA)
			}
			time.Sleep(20 * time.Millisecond)
		}
		// Let A's share settle, then check it held.
		time.Sleep(500 * time.Millisecond)
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.maxA != 3 || w.running["A"] != 3 {
			t.Fatalf("account A: at most %d at once, %d now; want exactly its share, 3", w.maxA, w.running["A"])
		}
	})
}
