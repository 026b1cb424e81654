package cluster

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// BenchmarkPlacementDispatch measures the two ways the node that accepted a
// create (A) can have the node placement chose (B) start the sandbox, A
// answering only once B has done so (a create answers once its sandbox
// runs):
//
//   - direct: what sandboxd does. A forwards the request through
//     Forwarder, signed with the cluster secret, to B's listener, which
//     checks it with Router.Forwarded (the cluster listener's own check),
//     does the work and answers.
//   - direct-rows: the same, B also writing the rows the River path
//     writes (the create's row inserted pending, then marked running).
//   - river/*: A inserts a job into B's queue (jobs.NodeQueue) with
//     jobs.Client, set up by jobs.New as serve sets it up, in one
//     transaction with the pending row a create writes (transactional
//     enqueue); B's River client works the queue, its worker does the work
//     and marks the row running; A waits for that, in one of three ways:
//     notify (B's update NOTIFYs, A LISTENs on a connection of its own: the
//     quickest a real implementation could learn it), poll (A reads the
//     row every dispatchPoll), jobstate (A reads the job's state every
//     dispatchPoll until River has marked it completed).
//
// The work is dispatchWork, a no-op, in every path: a real create's work
// (image, runtime) costs the same however the request arrived, so what
// differs is the dispatch alone. What a real create adds in every path
// (the caller's key looked up by its id, the sandbox's other rows) is left
// out of all. The River paths need the create's row to tell A the outcome,
// so they write it; direct-rows writes the same, for the like-for-like
// comparison, and direct writes nothing.
//
// The River paths need PostgreSQL (storetest: SANDBOXD_TEST_POSTGRES or
// Debian's postgresql-15; skipped without it unless
// SANDBOXD_REQUIRE_POSTGRES=1); direct needs nothing. Each reports the
// latency's p50, p90, p99 and mean in ms, requests issued one at a time
// (inflight=1) and 8 at a time (inflight=8); ns/op is wall time over
// requests, the inverse of throughput. Run with a fixed count so that p99
// rests on enough requests:
//
//	go test -run '^$' -bench PlacementDispatch -benchtime 400x ./internal/cluster/
func BenchmarkPlacementDispatch(b *testing.B) {
	inflights := []int{1, 8}
	b.Run("direct", func(b *testing.B) {
		for _, n := range inflights {
			b.Run(fmt.Sprintf("inflight=%d", n), func(b *testing.B) { benchDirect(b, n, nil) })
		}
	})
	// The direct path with the rows the River path writes (B inserts the
	// pending row and marks it running, as a create writes its sandbox's
	// rows wherever it runs): the like-for-like comparison, where only the
	// way the request travels differs.
	b.Run("direct-rows", func(b *testing.B) {
		st := storetest.Open(b, storetest.PostgresDSN(b))
		createDispatchTable(b, st.DB())
		for _, n := range inflights {
			b.Run(fmt.Sprintf("inflight=%d", n), func(b *testing.B) { benchDirect(b, n, st.DB()) })
		}
	})
	for _, q := range []struct {
		name  string
		tune  jobs.Config
		waits []dispatchWait
	}{
		// River as serve sets it up (jobs.New's defaults).
		{"river", jobs.Config{}, []dispatchWait{waitNotify, waitPoll, waitJobState}},
		// River's shortest FetchCooldown. It also bounds how often an
		// inserting client notifies a queue: with 5 ms, a create inserted
		// within 5 ms of the previous one is not notified, and unless a
		// fetch was due anyway it waits for the next poll
		// (FetchPollInterval). Job state is left out: River marks jobs
		// completed in batches every 250 ms however quickly it fetches.
		{"river-cooldown1ms", jobs.Config{FetchCooldown: time.Millisecond}, []dispatchWait{waitNotify, waitPoll}},
		// Both at River's minimum: the quickest River fetches at all
		// (every node's queues polled 1000 times a second, which no
		// deployment would want), to see whether any tuning closes the gap.
		{"river-cooldown1ms-poll1ms", jobs.Config{FetchCooldown: time.Millisecond, FetchPollInterval: time.Millisecond}, []dispatchWait{waitNotify}},
	} {
		b.Run(q.name, func(b *testing.B) {
			env := newRiverEnv(b, q.tune)
			for _, wait := range q.waits {
				for _, n := range inflights {
					b.Run(fmt.Sprintf("%s/inflight=%d", wait, n), func(b *testing.B) {
						measure(b, n, func(ctx context.Context) error { return env.dispatch(ctx, wait) })
					})
				}
			}
		})
	}
}

// dispatchWork is the start itself, stubbed: nothing, identical in every
// path, so that only the dispatch is measured.
func dispatchWork() {}

// createBody is a create request's body, as a client sends it.
const createBody = `{"template":"default","network":{"mode":"none"}}`

// benchDirect measures the direct path: A forwards a create to B's
// cluster listener, which authenticates it, does the work and answers.
// With rows (B's pool), B also writes the create's pending row before the
// work and marks it running after, as the River path does.
func benchDirect(b *testing.B, inflight int, rows *sql.DB) {
	nodeB := NewRouter(RouterConfig{NodeID: "b", Secret: secret}) // Forwarded needs no store
	// Tokens start again at each run of b.N, and so does the table.
	var seq atomic.Int64
	if rows != nil {
		if _, err := rows.ExecContext(b.Context(), `TRUNCATE bench_dispatch`); err != nil {
			b.Fatalf("empty the table of creates: %v", err)
		}
	}
	listener := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := nodeB.Forwarded(r); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		token := fmt.Sprint(seq.Add(1))
		if rows != nil {
			if _, err := rows.ExecContext(r.Context(), `INSERT INTO bench_dispatch (token, state) VALUES ($1, 'pending')`, token); err != nil {
				http.Error(w, fmt.Sprintf("insert the pending row: %v", err), http.StatusInternalServerError)
				return
			}
		}
		dispatchWork()
		if rows != nil {
			if _, err := rows.ExecContext(r.Context(), `UPDATE bench_dispatch SET state = 'running' WHERE token = $1`, token); err != nil {
				http.Error(w, fmt.Sprintf("mark the row running: %v", err), http.StatusInternalServerError)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK) // as a create answers
		_, _ = io.WriteString(w, `{"status":"success","sandboxes":[{"status":"running"}]}`)
	}))
	defer listener.Close()
	fw := NewForwarder(secret, "a", nil, slog.New(slog.DiscardHandler))
	b.Cleanup(fw.proxy.Transport.(*http.Transport).CloseIdleConnections)
	to := store.Node{ID: "b", Address: strings.TrimPrefix(listener.URL, "http://")}
	measure(b, inflight, func(ctx context.Context) error {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/api/sandboxes", strings.NewReader(createBody))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("x-api-key", "sbx_the_callers_key") // Forward removes it, as from any caller
		rec := httptest.NewRecorder()
		fw.Forward(rec, req, to, "key_bench", true)
		if rec.Code != http.StatusOK {
			return fmt.Errorf("forwarded create: %d %s", rec.Code, rec.Body)
		}
		return nil
	})
}

// dispatchWait is how A learns that B has started the sandbox.
type dispatchWait string

const (
	waitNotify   dispatchWait = "notify"
	waitPoll     dispatchWait = "poll"
	waitJobState dispatchWait = "jobstate"
)

// dispatchPoll is how often a polling A reads: River's own FetchCooldown in
// sandboxd, and more queries per waiting create than a real implementation
// would want to spend.
const dispatchPoll = 5 * time.Millisecond

// dispatchTimeout bounds one request, so that a lost job fails the
// benchmark instead of hanging it.
const dispatchTimeout = 30 * time.Second

// notifyChannel carries the token of each row B marked running.
const notifyChannel = "sandboxd_bench_dispatch"

// Serve's defaults for --job-concurrency and --job-concurrency-per-account.
const (
	serveJobConcurrency = 32
	serveJobsPerAccount = 8
)

// riverEnv is nodes A and B of the River path on one database: each with
// its own store (connection pool) and job client, as two processes have.
type riverEnv struct {
	dbA     *sql.DB
	jobsA   *jobs.Client
	waiters *notifyWaiters
	seq     atomic.Int64
}

// newRiverEnv starts nodes A and B on a database of their own, their job
// clients set up by jobs.New with tune's fetch settings (zero: serve's).
func newRiverEnv(b *testing.B, tune jobs.Config) *riverEnv {
	dsn := storetest.PostgresDSN(b)
	ctx := b.Context()
	stA, stB := storetest.Open(b, dsn), storetest.Open(b, dsn)
	createDispatchTable(b, stA.DB())

	workers := river.NewWorkers()
	river.AddWorker(workers, &dispatchWorker{db: stB.DB()})
	jobsB, err := jobs.New(ctx, stB, jobs.Config{NodeID: "b", Workers: workers,
		Concurrency: serveJobConcurrency, PerAccount: serveJobsPerAccount, PostgresDSN: dsn,
		FetchCooldown: tune.FetchCooldown, FetchPollInterval: tune.FetchPollInterval})
	if err != nil {
		b.Fatalf("node B's job client: %v", err)
	}
	if err := jobsB.Start(ctx); err != nil {
		b.Fatalf("node B's job client: %v", err)
	}
	b.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := jobsB.Stop(stopCtx); err != nil {
			b.Errorf("stop node B's job client: %v", err)
		}
	})

	// A only inserts (its own workers would not take B's queue).
	jobsA, err := jobs.New(ctx, stA, jobs.Config{NodeID: "a", PostgresDSN: dsn,
		FetchCooldown: tune.FetchCooldown, FetchPollInterval: tune.FetchPollInterval})
	if err != nil {
		b.Fatalf("node A's job client: %v", err)
	}
	b.Cleanup(jobsA.Close)

	waiters, err := listenDispatch(ctx, dsn)
	if err != nil {
		b.Fatalf("node A's listener: %v", err)
	}
	b.Cleanup(waiters.stop)
	return &riverEnv{dbA: stA.DB(), jobsA: jobsA, waiters: waiters}
}

// createDispatchTable creates the table of the creates' rows: a
// sandbox's row reduced to its status.
func createDispatchTable(b *testing.B, db *sql.DB) {
	if _, err := db.ExecContext(b.Context(), `CREATE TABLE bench_dispatch (token text PRIMARY KEY, state text NOT NULL)`); err != nil {
		b.Fatalf("create the table of creates: %v", err)
	}
}

// dispatch is one create sent through B's queue, returning once A has
// learnt, by wait, that B started it.
func (e *riverEnv) dispatch(ctx context.Context, wait dispatchWait) error {
	ctx, cancel := context.WithTimeout(ctx, dispatchTimeout)
	defer cancel()
	token := fmt.Sprint(e.seq.Add(1))
	var running <-chan struct{}
	if wait == waitNotify {
		// Before the insert: the notification may come before the
		// insert's call returns.
		running = e.waiters.add(token)
		defer e.waiters.remove(token)
	}
	tx, err := e.dbA.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin the create: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `INSERT INTO bench_dispatch (token, state) VALUES ($1, 'pending')`, token); err != nil {
		return fmt.Errorf("insert the pending row: %w", err)
	}
	if err := e.jobsA.InsertTx(ctx, tx, dispatchArgs{Token: token}, "b"); err != nil {
		return err
	}
	var jobID int64
	if wait == waitJobState {
		// jobs.Client does not return the job's id; the sequence's value
		// in this session is the id River's insert just took.
		if err := tx.QueryRowContext(ctx, `SELECT currval(pg_get_serial_sequence('river_job', 'id'))`).Scan(&jobID); err != nil {
			return fmt.Errorf("read the job's id: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit the create: %w", err)
	}

	switch wait {
	case waitNotify:
		select {
		case <-running:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("create %s: no notification: %w (listener: %v)", token, ctx.Err(), e.waiters.failure())
		}
	case waitPoll:
		return pollUntil(ctx, func() (bool, error) {
			var state string
			err := e.dbA.QueryRowContext(ctx, `SELECT state FROM bench_dispatch WHERE token = $1`, token).Scan(&state)
			return state == "running", err
		})
	case waitJobState:
		return pollUntil(ctx, func() (bool, error) {
			var state string
			err := e.dbA.QueryRowContext(ctx, `SELECT state FROM river_job WHERE id = $1`, jobID).Scan(&state)
			return state == "completed", err
		})
	}
	return fmt.Errorf("unknown wait %q", wait)
}

// pollUntil calls done every dispatchPoll until it says so.
func pollUntil(ctx context.Context, done func() (bool, error)) error {
	t := time.NewTicker(dispatchPoll)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("wait for the sandbox to run: %w", ctx.Err())
		}
		ok, err := done()
		if err != nil {
			return fmt.Errorf("wait for the sandbox to run: %w", err)
		}
		if ok {
			return nil
		}
	}
}

// dispatchArgs is the job of a create placed on B. Its field is named
// neither run_id nor sandbox_id, so jobs' per-account middleware lets it
// through without a query (a real create job would name its sandbox and
// cost that query more).
type dispatchArgs struct {
	Token string `json:"token"`
}

func (dispatchArgs) Kind() string { return "bench-dispatch" }

// dispatchWorker is B's side of the River path.
type dispatchWorker struct {
	river.WorkerDefaults[dispatchArgs]
	db *sql.DB // node B's pool
}

func (w *dispatchWorker) Work(ctx context.Context, job *river.Job[dispatchArgs]) error {
	dispatchWork()
	// One statement marks the row running and notifies: the notification
	// is delivered when it commits, so A never reads it before the row.
	var n int
	err := w.db.QueryRowContext(ctx, `WITH done AS (UPDATE bench_dispatch SET state = 'running' WHERE token = $1 RETURNING token)
		SELECT count(pg_notify($2, token)) FROM done`, job.Args.Token, notifyChannel).Scan(&n)
	if err != nil {
		return fmt.Errorf("mark create %s running: %w", job.Args.Token, err)
	}
	if n != 1 {
		return fmt.Errorf("mark create %s running: no such row", job.Args.Token)
	}
	return nil
}

// notifyWaiters is A's LISTEN connection and the creates waiting on it,
// by token.
type notifyWaiters struct {
	conn   *pgx.Conn
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	m   map[string]chan struct{}
	err error // why the listener stopped early
}

func listenDispatch(ctx context.Context, dsn string) (*notifyWaiters, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		_ = conn.Close(ctx)
		return nil, fmt.Errorf("listen: %w", err)
	}
	lctx, cancel := context.WithCancel(context.Background())
	w := &notifyWaiters{conn: conn, cancel: cancel, done: make(chan struct{}), m: map[string]chan struct{}{}}
	go w.loop(lctx)
	return w, nil
}

func (w *notifyWaiters) loop(ctx context.Context) {
	defer close(w.done)
	for {
		n, err := w.conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() == nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
			}
			return
		}
		w.mu.Lock()
		if ch, ok := w.m[n.Payload]; ok {
			close(ch)
			delete(w.m, n.Payload)
		}
		w.mu.Unlock()
	}
}

func (w *notifyWaiters) add(token string) <-chan struct{} {
	ch := make(chan struct{})
	w.mu.Lock()
	w.m[token] = ch
	w.mu.Unlock()
	return ch
}

func (w *notifyWaiters) remove(token string) {
	w.mu.Lock()
	delete(w.m, token)
	w.mu.Unlock()
}

func (w *notifyWaiters) failure() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *notifyWaiters) stop() {
	w.cancel()
	<-w.done
	_ = w.conn.Close(context.Background())
}

// measure issues b.N requests through do, inflight at a time, after a
// warm-up (connections, River's producers), and reports their latency.
func measure(b *testing.B, inflight int, do func(ctx context.Context) error) {
	ctx := b.Context()
	for range 2 * inflight {
		if err := do(ctx); err != nil {
			b.Fatalf("warm-up: %v", err)
		}
	}
	lat := make([]time.Duration, b.N)
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	b.ResetTimer()
	for range inflight {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(lat) {
					return
				}
				start := time.Now()
				if err := do(ctx); err != nil {
					errOnce.Do(func() { firstErr = err })
					next.Store(int64(len(lat))) // the others stop too
					return
				}
				lat[i] = time.Since(start)
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	reportLatency(b, lat)
}

// reportLatency reports lat's p50, p90, p99 (nearest rank) and mean in ms.
func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		b.Fatal("no request measured")
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	rank := func(p float64) time.Duration {
		return lat[min(len(lat)-1, max(0, int(math.Ceil(p*float64(len(lat))))-1))]
	}
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	b.ReportMetric(ms(rank(0.50)), "p50-ms")
	b.ReportMetric(ms(rank(0.90)), "p90-ms")
	b.ReportMetric(ms(rank(0.99)), "p99-ms")
	b.ReportMetric(ms(sum/time.Duration(len(lat))), "mean-ms")
}
