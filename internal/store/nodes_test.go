package store_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestNodes(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		steps := []struct {
			name string
			do   func() error
			want error
			// The node list afterwards.
			wantNodes []store.Node
		}{
			{"add b", func() error { return s.UpsertNode(ctx, &store.Node{ID: "b", Hostname: "host-b", StartedAt: t0}) }, nil,
				[]store.Node{{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms, Status: store.NodeUp}}},
			{"add a", func() error {
				return s.UpsertNode(ctx, &store.Node{ID: "a", Hostname: "host-a", StartedAt: t0, HeartbeatAt: t0.Add(time.Second), Status: store.NodeUp})
			}, nil, []store.Node{
				{ID: "a", Hostname: "host-a", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Second), Status: store.NodeUp},
				{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms, Status: store.NodeUp}}},
			{"heartbeat b", func() error { return s.HeartbeatNode(ctx, "b", t0.Add(time.Minute)) }, nil, []store.Node{
				{ID: "a", Hostname: "host-a", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Second), Status: store.NodeUp},
				{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Minute), Status: store.NodeUp}}},
			{"restart a", func() error {
				return s.UpsertNode(ctx, &store.Node{ID: "a", Hostname: "host-a2", StartedAt: t0.Add(time.Hour)})
			}, nil, []store.Node{
				{ID: "a", Hostname: "host-a2", StartedAt: t0ms.Add(time.Hour), HeartbeatAt: t0ms.Add(time.Hour), Status: store.NodeUp},
				{ID: "b", Hostname: "host-b", StartedAt: t0ms, HeartbeatAt: t0ms.Add(time.Minute), Status: store.NodeUp}}},
			{"heartbeat missing", func() error { return s.HeartbeatNode(ctx, "c", t0) }, store.ErrNotFound, nil},
			{"no id", func() error { return s.UpsertNode(ctx, &store.Node{Hostname: "x"}) }, store.ErrInvalid, nil},
			{"nil", func() error { return s.UpsertNode(ctx, nil) }, store.ErrInvalid, nil},
		}
		var want []store.Node
		for _, tt := range steps {
			wantErr(t, tt.name, tt.do(), tt.want)
			if tt.wantNodes != nil {
				want = tt.wantNodes
			}
			got, err := s.ListNodes(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%s: ListNodes = %+v, want %+v", tt.name, got, want)
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s: ListNodes = %+v, want %+v", tt.name, got, want)
				}
			}
		}
	})
}

// TestNodeFailure: a node whose heartbeats stopped is declared down by
// exactly one of the nodes that check at once; its heartbeats and
// re-registration are refused until it is set up again; the operator's
// schedule survives a restart; loads count active sandboxes per node.
func TestNodeFailure(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		capa := store.NodeCapacity{CPUs: 2, MemoryBytes: 24 << 30, MaxSandboxes: 200, Runtime: "gvisor", Network: true}
		for _, id := range []string{"a", "b"} {
			if err := s.UpsertNode(ctx, &store.Node{ID: id, Hostname: "host-" + id, Address: id + ":7000", StartedAt: t0, Capacity: capa, Version: "v1"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.HeartbeatNode(ctx, "b", t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := s.SetNodeSchedule(ctx, "b", store.NodeCordoned); err != nil {
			t.Fatal(err)
		}
		if err := s.SetNodeSchedule(ctx, "b", "bogus"); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("bad schedule: %v", err)
		}
		// Five checkers at once: a (stale) is declared once, b (fresh) never.
		var mu sync.Mutex
		declared := map[string]int{}
		var wg sync.WaitGroup
		for range 5 {
			wg.Go(func() {
				down, err := s.MarkNodesDown(ctx, t0.Add(30*time.Second), t0.Add(time.Minute))
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				for _, n := range down {
					declared[n.ID]++
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		if len(declared) != 1 || declared["a"] != 1 {
			t.Fatalf("declared down: %v, want a once", declared)
		}
		a, err := s.GetNode(ctx, "a")
		if err != nil || a.Status != store.NodeDown || a.DownAt.IsZero() || a.Capacity != capa || a.Address != "a:7000" {
			t.Fatalf("node a: %+v %v", a, err)
		}
		if err := s.HeartbeatNode(ctx, "a", t0.Add(2*time.Minute)); !errors.Is(err, store.ErrNodeDown) {
			t.Fatalf("heartbeat of a down node: %v", err)
		}
		if err := s.UpsertNode(ctx, &store.Node{ID: "a", Hostname: "host-a"}); !errors.Is(err, store.ErrNodeDown) {
			t.Fatalf("re-register a down node: %v", err)
		}
		if err := s.SetNodeUp(ctx, "a", t0.Add(3*time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := s.HeartbeatNode(ctx, "a", t0.Add(4*time.Minute)); err != nil {
			t.Fatalf("heartbeat once up again: %v", err)
		}
		// b restarts: still cordoned.
		if err := s.UpsertNode(ctx, &store.Node{ID: "b", Hostname: "host-b", StartedAt: t0.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if b, _ := s.GetNode(ctx, "b"); b.Schedule != store.NodeCordoned || b.Status != store.NodeUp {
			t.Fatalf("b after a restart: %+v", b)
		}
		acct := mustAccount(t, s, store.AccountPersonal, "Alice")
		for _, node := range []string{"a", "a", "b"} {
			if err := s.CreateSandbox(ctx, &store.Sandbox{AccountID: acct.ID, NodeID: node, Runtime: "gvisor", Status: store.SandboxRunning}); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CreateSandbox(ctx, &store.Sandbox{AccountID: acct.ID, NodeID: "b", Runtime: "gvisor", Status: store.SandboxStopped}); err != nil {
			t.Fatal(err)
		}
		loads, err := s.NodeLoads(ctx)
		if err != nil || loads["a"] != 2 || loads["b"] != 1 {
			t.Fatalf("loads %v %v", loads, err)
		}
	})
}
