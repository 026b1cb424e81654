package cluster

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

func TestPlace(t *testing.T) {
	now := time.Now()
	node := func(id string, max int, mod func(*store.Node)) store.Node {
		n := store.Node{ID: id, Address: id + ":7000", Status: store.NodeUp, HeartbeatAt: now,
			Capacity: store.NodeCapacity{MaxSandboxes: max, Runtime: "gvisor", Network: true}}
		if mod != nil {
			mod(&n)
		}
		return n
	}
	nodes := []store.Node{
		node("a", 100, nil), node("b", 100, nil), node("c", 100, nil),
		node("down", 100, func(n *store.Node) { n.Status = store.NodeDown }),
		node("cordoned", 100, func(n *store.Node) { n.Schedule = store.NodeCordoned }),
		node("stale", 100, func(n *store.Node) { n.HeartbeatAt = now.Add(-time.Hour) }),
		node("vm", 100, func(n *store.Node) { n.Capacity.Runtime, n.Capacity.Network = "microvm", false }),
	}
	p := Placer{Choices: 2, Stale: time.Minute, Rand: rand.New(rand.NewPCG(1, 2)), Now: func() time.Time { return now }}
	loads := map[string]int{}
	for range 300 {
		n, err := p.Place(nodes, loads, Need{Runtime: "gvisor", Network: true})
		if err != nil {
			t.Fatal(err)
		}
		loads[n.ID]++
	}
	if loads["a"]+loads["b"]+loads["c"] != 300 || loads["a"] < 90 || loads["b"] < 90 || loads["c"] < 90 {
		t.Fatalf("placement %v: not balanced over the healthy nodes, or placed on an unfit one", loads)
	}
	_, err := p.Place(nodes, loads, Need{Runtime: "gvisor", Fork: true})
	var noRoom *NoRoomError
	if !errors.As(err, &noRoom) {
		t.Fatalf("no node forks: %v", err)
	}
	for _, want := range []string{"7 nodes", "1 down", "1 cordoned", "1 not heartbeating", "1 without the gvisor runtime", "3 unable to fork"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	full := map[string]int{"a": 100, "b": 100, "c": 100}
	if _, err := p.Place(nodes, full, Need{Runtime: "gvisor"}); err == nil || !strings.Contains(err.Error(), "3 full") {
		t.Errorf("all full: %v", err)
	}
}
