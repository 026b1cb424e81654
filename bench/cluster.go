package bench

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
)

// ClusterOptions configure RunCluster: N `sandboxd serve` processes on the
// fake runtime, one PostgreSQL and one S3 store.
type ClusterOptions struct {
	Sandboxd  string // the sandboxd binary the nodes run
	Nodes     int
	Database  string // postgres:// URL of an empty (or reusable) database
	BlobStore string // s3:// URL shared by the nodes
	StateDir  string // the nodes' data dirs go under it
	// Creates is how many sandboxes each concurrency level creates.
	Creates int
	// Concurrency are the levels of creates in flight, one pass each:
	// where creates/s stops growing is where the control plane bends.
	Concurrency []int
	// Idle is how long the heartbeat-only load is measured.
	Idle time.Duration
	// DownAfter is the nodes' --node-down-after (heartbeat every
	// DownAfter/4, at most 10s).
	DownAfter time.Duration
	// Failure, when set, SIGKILLs the last node and measures how long
	// until it is declared down and its sandboxes failed.
	Failure bool
	Logger  *slog.Logger
}

// ClusterReport is what RunCluster measured.
type ClusterReport struct {
	Nodes     int    `json:"nodes"`
	CPUs      int    `json:"host_cpus"`
	Runtime   string `json:"runtime"`  // always "fake": the control plane alone
	PGStats   string `json:"pg_stats"` // "pg_stat_statements" or "pg_stat_database" (transactions only)
	DownAfter string `json:"node_down_after"`
	// StartSeconds is how long the N nodes took to become healthy and up.
	StartSeconds float64 `json:"start_seconds"`
	// NodeRSSMiB is the mean resident memory of a node process, idle.
	NodeRSSMiB float64 `json:"node_rss_mib"`

	Idle      ClusterPhase   `json:"idle"` // heartbeats and background work only
	Heartbeat HeartbeatCost  `json:"heartbeat"`
	Creates   []ClusterPhase `json:"creates"` // one per concurrency level
	// Placement is how the creates of every level spread over the nodes.
	Placement Spread            `json:"placement"`
	Direct    ClusterPhase      `json:"exec_direct"` // exec through the node hosting the sandbox
	Routed    ClusterPhase      `json:"exec_routed"` // exec through another node (forwarded)
	Stops     ClusterPhase      `json:"stops"`       // DELETE through any node
	Failure   *FailureDetection `json:"failure,omitempty"`
}

// ClusterPhase is one phase's requests and what they cost PostgreSQL.
type ClusterPhase struct {
	Name        string  `json:"name"`
	Concurrency int     `json:"concurrency,omitempty"`
	Errors      int     `json:"errors,omitempty"`
	FirstError  string  `json:"first_error,omitempty"`
	Seconds     float64 `json:"seconds"`
	Latency     Latency `json:"latency"`
	PerSecond   float64 `json:"per_second"`
	PG          PGCost  `json:"pg"`
	// NodesCPU and PGCPU are the cores the node processes and all of
	// PostgreSQL's processes used during the phase (2.0: two cores busy).
	NodesCPU float64 `json:"nodes_cpu_cores"`
	PGCPU    float64 `json:"pg_cpu_cores"`
	// CountedSeconds is the time PG.Statements and PG.Transactions span
	// (the phase and the settling after it); KindSeconds the time
	// PG.ByKind spans (from the reset of pg_stat_statements).
	CountedSeconds float64 `json:"counted_seconds"`
	KindSeconds    float64 `json:"kind_seconds,omitempty"`
}

// PGCost is PostgreSQL's work during a phase.
type PGCost struct {
	Statements   int64   `json:"statements"` // -1: pg_stat_statements unavailable
	Transactions int64   `json:"transactions"`
	PerOp        float64 `json:"statements_per_op"` // statements per request
	// NetPerOp is PerOp less the idle load's statements over the same
	// time: what the requests themselves cost.
	NetPerOp     float64 `json:"net_statements_per_op"`
	XactsPerOp   float64 `json:"transactions_per_op"`
	MaxConns     int     `json:"max_connections"` // backends on the database, most seen
	ConnsPerNode float64 `json:"connections_per_node"`
	// ByKind splits Statements: "river" (River's job fetching and
	// bookkeeping), "nodes" (membership: heartbeats, the node list,
	// judging), "other" (sandboxes, accounts, keys, ...).
	ByKind map[string]int64 `json:"by_kind,omitempty"`
	// Top are the statements run most often (pg_stat_statements).
	Top []PGStatement `json:"top,omitempty"`
}

// statementKind is the ByKind of a normalized statement.
func statementKind(query string) string {
	q := strings.ToLower(query)
	switch {
	case strings.Contains(q, "river_") || strings.Contains(q, "-- name: job") || strings.Contains(q, "-- name: queue") || strings.Contains(q, "-- name: leader"):
		return "river"
	case strings.Contains(q, " nodes"):
		return "nodes"
	}
	return "other"
}

// PGStatement is one normalized statement's calls in a phase.
type PGStatement struct {
	Calls   int64   `json:"calls"`
	TotalMS float64 `json:"total_ms"`
	Query   string  `json:"query"`
}

// HeartbeatCost is the idle load per node and per heartbeat.
type HeartbeatCost struct {
	EverySeconds         float64 `json:"every_seconds"`
	StatementsPerNodeSec float64 `json:"statements_per_node_second"`
	StatementsPerBeat    float64 `json:"statements_per_heartbeat"` // all idle statements / heartbeats
	// MembershipPerBeat counts only the statements on the nodes table
	// (the heartbeat itself, reading the others, judging them).
	MembershipPerBeat float64 `json:"membership_statements_per_heartbeat"`
	// RiverPerNodeSec is River's job fetching per node and second.
	RiverPerNodeSec float64 `json:"river_statements_per_node_second"`
	XactsPerBeat    float64 `json:"transactions_per_heartbeat"`
}

// Spread is how many sandboxes each node got.
type Spread struct {
	Sandboxes int `json:"sandboxes"`
	NodesUsed int `json:"nodes_used"`
	Min       int `json:"min"`
	Max       int `json:"max"`
}

// FailureDetection is a node killed with sandboxes on it.
type FailureDetection struct {
	Sandboxes int `json:"sandboxes"` // on the killed node
	// DownSeconds: kill until its row is no longer up.
	DownSeconds float64 `json:"down_seconds"`
	// FailedSeconds: kill until all its sandboxes are failed.
	FailedSeconds float64 `json:"failed_seconds"`
}

// clusterNode is one node process.
type clusterNode struct {
	id, base, dataDir string
	cmd               *exec.Cmd
	logs              *syncBuffer
	exited            chan struct{} // closed when the process has ended
}

// syncBuffer is a node's output, written by its process's copier and read
// by the benchmark.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// RunCluster starts o.Nodes nodes on the fake runtime and measures the
// control plane: idle heartbeats, creates at each concurrency level,
// execs direct and routed, stops, and (o.Failure) a node's death.
func RunCluster(ctx context.Context, o ClusterOptions) (_ ClusterReport, err error) {
	if o.Nodes < 1 || o.Creates < 1 || len(o.Concurrency) == 0 {
		return ClusterReport{}, errors.New("bench cluster: need at least one node, one create and one concurrency level")
	}
	if o.Failure && o.Nodes < 2 {
		o.Failure = false
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	rep := ClusterReport{Nodes: o.Nodes, CPUs: goruntime.NumCPU(), Runtime: "fake", DownAfter: o.DownAfter.String()}
	db, err := sql.Open("pgx", o.Database)
	if err != nil {
		return rep, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	c := &benchCluster{o: o, http: &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	defer c.stop()
	pg := &pgWatch{db: db, nodes: c.pids}
	if rep.PGStats, err = pg.init(ctx); err != nil {
		return rep, err
	}

	start := time.Now()
	log.Info("starting nodes", "n", o.Nodes)
	if err := c.start(ctx); err != nil {
		return rep, err
	}
	if err := c.waitUp(ctx, db); err != nil {
		return rep, err
	}
	rep.StartSeconds = round(time.Since(start).Seconds())
	rep.NodeRSSMiB = c.meanRSS()
	key, err := c.account(ctx)
	if err != nil {
		return rep, err
	}

	log.Info("idle", "for", o.Idle)
	rep.Idle = pg.phase(ctx, "idle", o.Nodes, func() (int, []time.Duration, []error) {
		time.Sleep(o.Idle)
		return 1, nil, nil
	})
	beat := min(o.DownAfter/4, 10*time.Second)
	rep.Heartbeat = heartbeatCost(rep.Idle, o.Nodes, beat)
	if rep.Idle.PG.Statements > 0 && rep.Idle.CountedSeconds > 0 {
		pg.idleRate = float64(rep.Idle.PG.Statements) / rep.Idle.CountedSeconds
	}

	var ids []string
	for _, k := range o.Concurrency {
		log.Info("creates", "n", o.Creates, "concurrency", k)
		var mu sync.Mutex
		ph := pg.phase(ctx, "create", o.Nodes, func() (int, []time.Duration, []error) {
			return parallel(o.Creates, k, func(i int) error {
				id, err := c.create(ctx, c.nodes[i%len(c.nodes)], key)
				if err == nil {
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
				}
				return err
			})
		})
		ph.Concurrency = k
		rep.Creates = append(rep.Creates, ph)
	}
	hosts, err := c.hosts(ctx, db, ids)
	if err != nil {
		return rep, err
	}
	rep.Placement = spread(hosts, c.nodes)

	log.Info("execs", "n", len(ids))
	rep.Direct = pg.phase(ctx, "exec direct", o.Nodes, func() (int, []time.Duration, []error) {
		return parallel(len(ids), 4, func(i int) error { return c.exec(ctx, c.byID(hosts[ids[i]]), key, ids[i]) })
	})
	if o.Nodes > 1 {
		rep.Routed = pg.phase(ctx, "exec routed", o.Nodes, func() (int, []time.Duration, []error) {
			return parallel(len(ids), 4, func(i int) error { return c.exec(ctx, c.other(hosts[ids[i]]), key, ids[i]) })
		})
	}
	log.Info("stops", "n", len(ids))
	rep.Stops = pg.phase(ctx, "stop", o.Nodes, func() (int, []time.Duration, []error) {
		return parallel(len(ids), 4, func(i int) error { return c.stopAndDelete(ctx, c.nodes[(i+1)%len(c.nodes)], key, ids[i]) })
	})
	if o.Failure {
		log.Info("failure: killing a node")
		if rep.Failure, err = c.failure(ctx, db, key); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// heartbeatCost divides the idle load by the heartbeats it held, each
// count over the time it spans.
func heartbeatCost(idle ClusterPhase, nodes int, every time.Duration) HeartbeatCost {
	h := HeartbeatCost{EverySeconds: every.Seconds()}
	d, dk := idle.CountedSeconds, idle.KindSeconds
	if nodes == 0 || d <= 0 || every <= 0 {
		return h
	}
	beats := float64(nodes) * d / every.Seconds()
	if idle.PG.Statements >= 0 {
		h.StatementsPerNodeSec = round(float64(idle.PG.Statements) / float64(nodes) / d)
		h.StatementsPerBeat = round(float64(idle.PG.Statements) / beats)
	}
	h.XactsPerBeat = round(float64(idle.PG.Transactions) / beats)
	if dk > 0 {
		kbeats := float64(nodes) * dk / every.Seconds()
		h.MembershipPerBeat = round(float64(idle.PG.ByKind["nodes"]) / kbeats)
		h.RiverPerNodeSec = round(float64(idle.PG.ByKind["river"]) / float64(nodes) / dk)
	}
	return h
}

// spread counts the sandboxes per node.
func spread(hosts map[string]string, nodes []*clusterNode) Spread {
	per := map[string]int{}
	for _, n := range hosts {
		per[n]++
	}
	s := Spread{Sandboxes: len(hosts), NodesUsed: len(per)}
	for i, n := range nodes {
		c := per[n.id]
		if i == 0 || c < s.Min {
			s.Min = c
		}
		s.Max = max(s.Max, c)
	}
	return s
}

// parallel runs op(0..n-1), k at a time, timing each: how many ran, the
// successful durations, and the errors.
func parallel(n, k int, op func(i int) error) (int, []time.Duration, []error) {
	var (
		mu   sync.Mutex
		ds   []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan int)
	for range max(1, k) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t := time.Now()
				err := op(i)
				d := time.Since(t)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ds = append(ds, d)
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return n, ds, errs
}

// pgWatch reads PostgreSQL's statistics of the benchmark's database.
type pgWatch struct {
	db         *sql.DB
	nodes      func() []int // the node processes' pids
	idleRate   float64      // statements per second of the idle phase
	statements bool
	// own counts the watcher's queries, each a transaction of its own,
	// to take them out of pg_stat_database's count.
	own atomic.Int64
}

func (p *pgWatch) init(ctx context.Context) (string, error) {
	if err := p.db.PingContext(ctx); err != nil {
		return "", fmt.Errorf("bench cluster: PostgreSQL: %w", err)
	}
	_, _ = p.db.ExecContext(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	if _, err := p.db.ExecContext(ctx, "SELECT pg_stat_statements_reset()"); err == nil {
		p.statements = true
		return "pg_stat_statements", nil
	}
	return "pg_stat_database", nil
}

// notOurs leaves out the watcher's own statements: every one of them,
// and none of the cluster's, reads a pg_stat_ view.
const notOurs = `query NOT LIKE '%pg_stat_%'`

// counters are the database's statements (-1 without
// pg_stat_statements) and transactions so far.
func (p *pgWatch) counters(ctx context.Context) (stmts, xacts int64) {
	stmts = -1
	p.own.Add(2)
	if p.statements {
		_ = p.db.QueryRowContext(ctx, `SELECT coalesce(sum(calls),0)::bigint FROM pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND `+notOurs).Scan(&stmts)
	}
	// pg_stat_database is updated when backends report (at most every
	// second, or at the end of a transaction when idle).
	_ = p.db.QueryRowContext(ctx, `SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()`).Scan(&xacts)
	return stmts, xacts
}

// conns is the number of backends on the database, this one excluded.
func (p *pgWatch) conns(ctx context.Context) int {
	var n int
	p.own.Add(1)
	_ = p.db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n)
	return n
}

// top are the phase's five most frequent statements and its statements
// by kind (pg_stat_statements was reset when the phase began).
func (p *pgWatch) top(ctx context.Context) ([]PGStatement, map[string]int64) {
	if !p.statements {
		return nil, nil
	}
	p.own.Add(1)
	rows, err := p.db.QueryContext(ctx, `SELECT calls, total_exec_time, regexp_replace(query, '\s+', ' ', 'g') FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND `+notOurs+` ORDER BY calls DESC`)
	if err != nil {
		return nil, nil
	}
	defer rows.Close()
	var out []PGStatement
	kinds := map[string]int64{}
	for rows.Next() {
		var s PGStatement
		if rows.Scan(&s.Calls, &s.TotalMS, &s.Query) != nil {
			continue
		}
		kinds[statementKind(s.Query)] += s.Calls
		if len(out) < 5 {
			s.TotalMS = round(s.TotalMS)
			if len(s.Query) > 120 {
				s.Query = s.Query[:120]
			}
			out = append(out, s)
		}
	}
	return out, kinds
}

// phase runs fn while sampling the database's connections, and reports
// its latencies and what it cost PostgreSQL per operation.
func (p *pgWatch) phase(ctx context.Context, name string, nodes int, fn func() (int, []time.Duration, []error)) ClusterPhase {
	if p.statements {
		_, _ = p.db.ExecContext(ctx, "SELECT pg_stat_statements_reset()")
	}
	reset := time.Now()
	time.Sleep(1100 * time.Millisecond) // let backends flush their transaction counts
	s0, x0 := p.counters(ctx)
	counted := time.Now()
	own0 := p.own.Load()
	maxConns := p.conns(ctx)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				n := p.conns(ctx)
				mu.Lock()
				maxConns = max(maxConns, n)
				mu.Unlock()
			}
		}
	}()
	n0, g0 := cpuByPid(p.nodes()), cpuByPid(p.pgPids(ctx))
	start := time.Now()
	n, ds, errs := fn()
	secs := time.Since(start).Seconds()
	nodeTicks, pgTicks := cpuDelta(n0, p.nodes()), cpuDelta(g0, p.pgPids(ctx))
	close(done)
	wg.Wait()
	time.Sleep(1100 * time.Millisecond)
	s1, x1 := p.counters(ctx)
	x1 -= p.own.Load() - own0
	ph := ClusterPhase{Name: name, Seconds: round(secs), Latency: latency(ds, n), CountedSeconds: round(time.Since(counted).Seconds())}
	ph.Latency.Samples = nil
	if len(errs) > 0 {
		ph.Errors, ph.FirstError = len(errs), errs[0].Error()
	}
	if secs > 0 && len(ds) > 0 {
		ph.PerSecond = round(float64(len(ds)) / secs)
	}
	ph.PG = pgCost(s0, s1, x0, x1, maxConns, nodes, len(ds))
	if ph.PG.Statements >= 0 && len(ds) > 0 {
		ph.PG.NetPerOp = round(max(0, float64(ph.PG.Statements)-p.idleRate*ph.CountedSeconds) / float64(len(ds)))
	}
	if secs > 0 {
		ph.NodesCPU = round(float64(nodeTicks) / clockTicks / secs)
		ph.PGCPU = round(float64(pgTicks) / clockTicks / secs)
	}
	if ph.PG.Statements > 0 {
		ph.PG.Top, ph.PG.ByKind = p.top(ctx)
		ph.KindSeconds = round(time.Since(reset).Seconds())
	}
	return ph
}

// pgCost is the deltas of the counters per operation.
func pgCost(s0, s1, x0, x1 int64, maxConns, nodes, ops int) PGCost {
	c := PGCost{Statements: -1, Transactions: x1 - x0, MaxConns: maxConns}
	if s0 >= 0 && s1 >= 0 {
		c.Statements = s1 - s0
	}
	if nodes > 0 {
		c.ConnsPerNode = round(float64(maxConns) / float64(nodes))
	}
	if ops > 0 {
		if c.Statements >= 0 {
			c.PerOp = round(float64(c.Statements) / float64(ops))
		}
		c.XactsPerOp = round(float64(c.Transactions) / float64(ops))
	}
	return c
}

// benchCluster is the node processes and the client that drives them.
type benchCluster struct {
	o      ClusterOptions
	nodes  []*clusterNode
	http   *http.Client
	secret string
}

// nextPort is where freeAddrs looks next: below Linux's default
// ephemeral range (32768-60999), so that no node's outgoing connection
// takes a port between its finding and a node binding it (50 nodes make
// thousands of connections while they start).
var nextPort = 20000 + rand.IntN(4000)

// freeAddrs finds n loopback addresses nobody listens on.
func freeAddrs(n int) ([]string, error) {
	var out []string
	for len(out) < n && nextPort < 32768 {
		addr := fmt.Sprintf("127.0.0.1:%d", nextPort)
		nextPort++
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		out = append(out, addr)
	}
	if len(out) < n {
		return nil, errors.New("bench cluster: no free ports left below 32768")
	}
	return out, nil
}

// start starts the nodes: the first alone (it migrates the database),
// then the others at once.
func (c *benchCluster) start(ctx context.Context) error {
	c.secret = filepath.Join(c.o.StateDir, "cluster-secret")
	if err := os.MkdirAll(c.o.StateDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(c.secret, []byte(strings.Repeat("0123456789abcdef", 4)), 0o600); err != nil {
		return err
	}
	for i := range c.o.Nodes {
		addrs, err := freeAddrs(3)
		if err != nil {
			return err
		}
		n := &clusterNode{base: "http://" + addrs[0], dataDir: filepath.Join(c.o.StateDir, fmt.Sprintf("node%d", i)), logs: &syncBuffer{}, exited: make(chan struct{})}
		n.cmd = exec.Command(c.o.Sandboxd, "serve", "--runtime", "fake", "--data-dir", n.dataDir,
			"--database", c.o.Database, "--blob-store", c.o.BlobStore,
			"--listen", addrs[0], "--metrics-addr", addrs[1], "--cluster-listen", addrs[2], "--cluster-secret-file", c.secret,
			"--node-down-after", c.o.DownAfter.String(), "--node-capacity", "0", "--max-sandboxes-per-account", "0",
			"--sandbox-disk-mib", "0", "--setup-on-first-use=false", "--warm-pool", "0", "--prewarm", "0", "--template-pool", "0")
		n.cmd.Env = append(os.Environ(), "SANDBOXD_FAKE_RUNTIME=1")
		n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
		if err := n.cmd.Start(); err != nil {
			return fmt.Errorf("start node %d: %w", i, err)
		}
		go func() { _ = n.cmd.Wait(); close(n.exited) }()
		c.nodes = append(c.nodes, n)
		if i == 0 {
			if err := c.healthy(ctx, n); err != nil {
				return err
			}
		}
	}
	for _, n := range c.nodes {
		if err := c.healthy(ctx, n); err != nil {
			return err
		}
		b, err := os.ReadFile(filepath.Join(n.dataDir, "node-id"))
		if err != nil {
			return err
		}
		n.id = strings.TrimSpace(string(b))
	}
	return nil
}

func (c *benchCluster) healthy(ctx context.Context, n *clusterNode) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if resp, err := c.http.Get(n.base + "/api/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-n.exited:
			return fmt.Errorf("node %s exited before it was healthy:\n%s", n.dataDir, tail(n.logs.String(), 4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("node %s did not become healthy:\n%s", n.dataDir, tail(n.logs.String(), 4000))
}

// waitUp waits until every node's row is up.
func (c *benchCluster) waitUp(ctx context.Context, db *sql.DB) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var up int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM nodes WHERE status = 'up'`).Scan(&up); err == nil && up >= len(c.nodes) {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("bench cluster: the nodes were not all up within 2 minutes")
}

// pids are the running nodes' processes.
func (c *benchCluster) pids() []int {
	var out []int
	for _, n := range c.nodes {
		select {
		case <-n.exited:
		default:
			out = append(out, n.cmd.Process.Pid)
		}
	}
	return out
}

// clockTicks is the kernel's USER_HZ: /proc's CPU times are in 1/100 s.
const clockTicks = 100

// pgPids are the server's processes (backends and its background
// workers) as pg_stat_activity lists them; on another host their CPU is
// not found and PGCPU stays 0.
func (p *pgWatch) pgPids(ctx context.Context) []int {
	p.own.Add(1)
	rows, err := p.db.QueryContext(ctx, `SELECT pid FROM pg_stat_activity`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			out = append(out, pid)
		}
	}
	return out
}

// cpuDelta is the CPU ticks pids used since before (ticks by pid); a
// process that ended meanwhile is not counted, one that started is counted
// whole.
func cpuDelta(before map[int]int64, pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		sum += statTicks(fmt.Sprintf("/proc/%d/stat", pid)) - before[pid]
	}
	return sum
}

// cpuByPid is each pid's CPU ticks so far.
func cpuByPid(pids []int) map[int]int64 {
	m := map[int]int64{}
	for _, pid := range pids {
		m[pid] = statTicks(fmt.Sprintf("/proc/%d/stat", pid))
	}
	return m
}

func (c *benchCluster) meanRSS() float64 {
	var sum float64
	var n int
	for _, node := range c.nodes {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", node.cmd.Process.Pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			var kb float64
			if _, err := fmt.Sscanf(line, "VmRSS: %f kB", &kb); err == nil {
				sum += kb / 1024
				n++
			}
		}
	}
	if n == 0 {
		return 0
	}
	return round(sum / float64(n))
}

func (c *benchCluster) stop() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.cmd.Process.Signal(os.Interrupt)
			select {
			case <-n.exited:
			case <-time.After(30 * time.Second):
				_ = n.cmd.Process.Kill()
				<-n.exited
			}
		}()
	}
	wg.Wait()
}

// account creates the benchmark's account through the database.
func (c *benchCluster) account(ctx context.Context) (string, error) {
	return adminKey(ctx, c.o.Sandboxd, fmt.Sprintf("bench-cluster-%d", time.Now().UnixNano()), "--database", c.o.Database, "--data-dir", c.nodes[0].dataDir)
}

func (c *benchCluster) call(ctx context.Context, n *clusterNode, key, method, path string, body, out any) error {
	_, err := callAPI(ctx, c.http, n.base, key, method, path, body, out, 1<<20)
	return err
}

func (c *benchCluster) create(ctx context.Context, n *clusterNode, key string) (string, error) {
	var out created
	if err := c.call(ctx, n, key, http.MethodPost, "/api/sandboxes", map[string]any{"timeout": 3600000}, &out); err != nil {
		return "", err
	}
	if len(out.Sandboxes) == 0 {
		return "", errors.New("create answered no sandbox")
	}
	return out.Sandboxes[0].SandboxID, nil
}

func (c *benchCluster) exec(ctx context.Context, n *clusterNode, key, id string) error {
	if n == nil {
		return fmt.Errorf("sandbox %s: no node to reach it through", id)
	}
	var out struct {
		ExitCode int `json:"exitCode"`
	}
	if err := c.call(ctx, n, key, http.MethodPost, "/api/sandboxes/"+id+"/exec", map[string]any{"command": "true"}, &out); err != nil {
		return err
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("exec exited %d", out.ExitCode)
	}
	return nil
}

// stopAndDelete stops the sandbox and deletes it, both through n.
func (c *benchCluster) stopAndDelete(ctx context.Context, n *clusterNode, key, id string) error {
	if err := c.call(ctx, n, key, http.MethodPost, "/api/sandboxes/"+id+"/stop", nil, nil); err != nil {
		return err
	}
	return c.call(ctx, n, key, http.MethodDelete, "/api/sandboxes/"+id, nil, nil)
}

// hosts maps each sandbox to the node hosting it.
func (c *benchCluster) hosts(ctx context.Context, db *sql.DB, ids []string) (map[string]string, error) {
	out := map[string]string{}
	for _, id := range ids {
		var node string
		if err := db.QueryRowContext(ctx, `SELECT node_id FROM sandboxes WHERE id = $1`, id).Scan(&node); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		out[id] = node
	}
	return out, nil
}

func (c *benchCluster) byID(id string) *clusterNode {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// other is a node that does not host the sandbox, at random.
func (c *benchCluster) other(host string) *clusterNode {
	if len(c.nodes) < 2 {
		return nil
	}
	for {
		n := c.nodes[rand.IntN(len(c.nodes))]
		if n.id != host {
			return n
		}
	}
}

// failure creates sandboxes until the last node hosts some, SIGKILLs it,
// and times its detection.
func (c *benchCluster) failure(ctx context.Context, db *sql.DB, key string) (*FailureDetection, error) {
	victim := c.nodes[len(c.nodes)-1]
	var mine []string
	for i := 0; len(mine) < 3 && i < 20*len(c.nodes); i++ {
		id, err := c.create(ctx, c.nodes[i%(len(c.nodes)-1)], key)
		if err != nil {
			return nil, err
		}
		var node string
		if err := db.QueryRowContext(ctx, `SELECT node_id FROM sandboxes WHERE id = $1`, id).Scan(&node); err != nil {
			return nil, err
		}
		if node == victim.id {
			mine = append(mine, id)
		}
	}
	if len(mine) == 0 {
		return nil, errors.New("bench cluster: placement put nothing on the node to kill")
	}
	killed := time.Now()
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return nil, err
	}
	<-victim.exited
	f := &FailureDetection{Sandboxes: len(mine)}
	deadline := killed.Add(10*c.o.DownAfter + time.Minute)
	for time.Now().Before(deadline) && (f.DownSeconds == 0 || f.FailedSeconds == 0) {
		if f.DownSeconds == 0 {
			var status string
			if err := db.QueryRowContext(ctx, `SELECT status FROM nodes WHERE id = $1`, victim.id).Scan(&status); err == nil && status != "up" {
				f.DownSeconds = round(time.Since(killed).Seconds())
			}
		}
		if f.FailedSeconds == 0 {
			var left int
			q := `SELECT count(*) FROM sandboxes WHERE node_id = $1 AND status <> 'failed' AND id = ANY($2)`
			if err := db.QueryRowContext(ctx, q, victim.id, mine).Scan(&left); err == nil && left == 0 {
				f.FailedSeconds = round(time.Since(killed).Seconds())
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if f.DownSeconds == 0 || f.FailedSeconds == 0 {
		return f, fmt.Errorf("bench cluster: the killed node was not declared down (%v) or its sandboxes failed (%v) in time", f.DownSeconds, f.FailedSeconds)
	}
	return f, nil
}
