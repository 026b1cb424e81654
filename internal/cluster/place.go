package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Need is what a new sandbox needs of its node.
type Need struct {
	Runtime string // "": any
	Network bool
	Fork    bool
}

// NoRoomError says why no node can take a sandbox: each node's reason,
// so that a capacity refusal is never opaque.
type NoRoomError struct {
	Nodes   int
	Reasons map[string]int // reason -> how many nodes
}

func (e *NoRoomError) Error() string {
	if e.Nodes == 0 {
		return "no node is registered"
	}
	parts := make([]string, 0, len(e.Reasons))
	for _, r := range sortedKeys(e.Reasons) {
		parts = append(parts, fmt.Sprintf("%d %s", e.Reasons[r], r))
	}
	return fmt.Sprintf("no node can take the sandbox (%d nodes: %s)", e.Nodes, strings.Join(parts, ", "))
}

// Placer chooses nodes for new sandboxes.
type Placer struct {
	// Choices is K of best-of-K: how many fitting nodes are picked at
	// random, of which the freest wins (2 balances nearly as well as
	// looking at all, without every node piling onto the same one).
	Choices int
	// Stale is how old a heartbeat may be for a node to count as healthy
	// (a node not yet declared down may already be gone).
	Stale time.Duration
	Rand  *rand.Rand // nil: the global source
	Now   func() time.Time
}

// Place picks the node for a sandbox that needs need among nodes, with
// loads the active sandboxes of each. It returns a *NoRoomError when none
// fits.
func (p Placer) Place(nodes []store.Node, loads map[string]int, need Need) (store.Node, error) {
	now := time.Now()
	if p.Now != nil {
		now = p.Now()
	}
	noRoom := &NoRoomError{Nodes: len(nodes), Reasons: map[string]int{}}
	var fit []store.Node
	free := map[string]int{}
	for _, n := range nodes {
		if why := p.unfit(n, loads[n.ID], need, now); why != "" {
			noRoom.Reasons[why]++
			continue
		}
		fit = append(fit, n)
		free[n.ID] = freePlaces(n, loads[n.ID])
	}
	if len(fit) == 0 {
		return store.Node{}, noRoom
	}
	k := max(1, p.Choices)
	intn := rand.IntN
	if p.Rand != nil {
		intn = p.Rand.IntN
	}
	var best store.Node
	for i := range min(k, len(fit)) {
		// A partial Fisher-Yates shuffle: K distinct picks.
		j := i + intn(len(fit)-i)
		fit[i], fit[j] = fit[j], fit[i]
		if i == 0 || free[fit[i].ID] > free[best.ID] {
			best = fit[i]
		}
	}
	return best, nil
}

// unfit says why node n cannot take the sandbox, or "" when it can.
func (p Placer) unfit(n store.Node, load int, need Need, now time.Time) string {
	c := n.Capacity
	switch {
	case n.Status != store.NodeUp:
		return "down"
	case p.Stale > 0 && now.Sub(n.HeartbeatAt) > p.Stale:
		return "not heartbeating"
	case n.Schedule != "":
		return n.Schedule
	case n.Address == "":
		return "without a cluster address"
	case need.Runtime != "" && c.Runtime != need.Runtime:
		return "without the " + need.Runtime + " runtime"
	case need.Network && !c.Network:
		return "without sandbox networks"
	case need.Fork && !c.Fork:
		return "unable to fork"
	case c.MaxSandboxes > 0 && load >= c.MaxSandboxes:
		return "full"
	}
	return ""
}

// freePlaces is how many more sandboxes n takes (a node without a limit
// counts as very free).
func freePlaces(n store.Node, load int) int {
	if n.Capacity.MaxSandboxes <= 0 {
		return 1 << 30
	}
	return n.Capacity.MaxSandboxes - load
}

func sortedKeys(m map[string]int) []string {
	return slices.Sorted(maps.Keys(m))
}

// Place implements api.Cluster.
func (r *Router) Place(ctx context.Context, network *netpol.Policy) (string, bool, error) {
	nodes, err := r.st.ListNodes(ctx)
	if err != nil {
		return "", false, err
	}
	loads, err := r.st.NodeLoads(ctx)
	if err != nil {
		return "", false, err
	}
	need := Need{Network: r.defaultNetwork}
	if network != nil {
		need.Network = network.Mode != "" && network.Mode != netpol.ModeNone
	}
	n, err := r.placer.Place(nodes, loads, need)
	var noRoom *NoRoomError
	if errors.As(err, &noRoom) {
		return "", false, errdefs.Newf(errdefs.ErrQuota, "%s; try again later", noRoom)
	}
	if err != nil {
		return "", false, err
	}
	return n.ID, n.ID == r.self, nil
}
