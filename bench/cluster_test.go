package bench

import (
	"errors"
	"testing"
	"time"
)

func TestHeartbeatCost(t *testing.T) {
	idle := ClusterPhase{CountedSeconds: 20, KindSeconds: 25,
		PG: PGCost{Statements: 1200, Transactions: 600, ByKind: map[string]int64{"nodes": 300, "river": 1000}}}
	// 10 nodes, 20s, a beat every 2.5s: 80 heartbeats; by kind over 25s:
	// 100 heartbeats.
	h := heartbeatCost(idle, 10, 2500*time.Millisecond)
	if h.EverySeconds != 2.5 || h.StatementsPerNodeSec != 6 || h.StatementsPerBeat != 15 || h.XactsPerBeat != 7.5 ||
		h.MembershipPerBeat != 3 || h.RiverPerNodeSec != 4 {
		t.Fatalf("%+v", h)
	}
	// Without pg_stat_statements only transactions are counted.
	idle.PG.Statements, idle.PG.ByKind, idle.KindSeconds = -1, nil, 0
	if h := heartbeatCost(idle, 10, 2500*time.Millisecond); h.StatementsPerBeat != 0 || h.XactsPerBeat != 7.5 || h.MembershipPerBeat != 0 {
		t.Fatalf("%+v", h)
	}
	if h := heartbeatCost(idle, 0, 0); h.XactsPerBeat != 0 {
		t.Fatalf("no nodes: %+v", h)
	}
}

func TestPGCost(t *testing.T) {
	c := pgCost(100, 300, 10, 60, 40, 4, 20)
	want := PGCost{Statements: 200, Transactions: 50, PerOp: 10, XactsPerOp: 2.5, MaxConns: 40, ConnsPerNode: 10}
	if c.Statements != want.Statements || c.Transactions != want.Transactions || c.PerOp != want.PerOp ||
		c.XactsPerOp != want.XactsPerOp || c.MaxConns != want.MaxConns || c.ConnsPerNode != want.ConnsPerNode {
		t.Fatalf("got %+v, want %+v", c, want)
	}
	if c := pgCost(-1, -1, 0, 8, 1, 1, 4); c.Statements != -1 || c.PerOp != 0 || c.XactsPerOp != 2 {
		t.Fatalf("without pg_stat_statements: %+v", c)
	}
}

func TestSpread(t *testing.T) {
	nodes := []*clusterNode{{id: "a"}, {id: "b"}, {id: "c"}}
	s := spread(map[string]string{"s1": "a", "s2": "a", "s3": "b"}, nodes)
	if s != (Spread{Sandboxes: 3, NodesUsed: 2, Min: 0, Max: 2}) {
		t.Fatalf("%+v", s)
	}
}

func TestParallel(t *testing.T) {
	n, ds, errs := parallel(10, 3, func(i int) error {
		if i%5 == 0 {
			return errors.New("refused")
		}
		return nil
	})
	if n != 10 || len(ds) != 8 || len(errs) != 2 {
		t.Fatalf("n %d, %d ok, %d errors", n, len(ds), len(errs))
	}
}

func TestStatementKind(t *testing.T) {
	for q, want := range map[string]string{
		"-- name: JobGetAvailable :many WITH locked_jobs AS (SELECT id FROM river_job)": "river",
		"UPDATE nodes SET heartbeat_at = $1 WHERE id = $2 AND status = $3":              "nodes",
		"SELECT id, hostname FROM nodes WHERE id = $1":                                  "nodes",
		"INSERT INTO sandboxes (id, account_id, node_id) VALUES ($1, $2, $3)":           "other",
	} {
		if got := statementKind(q); got != want {
			t.Errorf("%q: %s, want %s", q, got, want)
		}
	}
}
