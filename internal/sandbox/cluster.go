package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Membership of a cluster: every node registers itself (where the others
// reach it, what it offers) and heartbeats; every node also watches the
// others, and the first to see a node silent for DownAfter declares it
// down (a compare-and-set in the database: one declarer per node, no
// consensus of our own) and fails what it hosted: its active sandboxes
// become failed with the reason (their keys revoked by the stop hooks),
// their executing runs CRASHED, and the jobs queued for it move to the
// shared queue, where another node finishes them cleanly. A node that
// learns it was declared down (its heartbeat is refused, or its
// registration after a restart) gives up what it hosted — destroys its
// runtime sandboxes that have no active row of its own any more — and
// only then is up again: it never resurrects a failed sandbox.

// NodeInfo is what a node registers besides its id.
type NodeInfo struct {
	Address  string // its cluster listener, as other nodes reach it ("": none)
	Capacity store.NodeCapacity
	Version  string
}

// heartbeatEvery is how often a node says it is alive: often enough that
// a node down for DownAfter misses several.
func (m *Manager) heartbeatEvery() time.Duration {
	if d := m.cfg.DownAfter / 4; d > 0 && d < 10*time.Second {
		return d
	}
	return 10 * time.Second
}

// register records this node as up, giving up first what it hosted if it
// was declared down while it was away.
func (m *Manager) register(ctx context.Context) error {
	host, _ := os.Hostname()
	now := m.now()
	node := store.Node{ID: m.cfg.NodeID, Hostname: host, StartedAt: now, HeartbeatAt: now,
		Address: m.cfg.Node.Address, Capacity: m.cfg.Node.Capacity, Version: m.cfg.Node.Version}
	err := m.st.UpsertNode(ctx, &node)
	if errors.Is(err, store.ErrNodeDown) {
		if err = m.rejoin(ctx); err == nil {
			err = m.st.UpsertNode(ctx, &node)
		}
	}
	if err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	m.heartbeatDone(true)
	return nil
}

// heartbeatDone records whether this node's heartbeat reached the
// database: since when its own heartbeats have gone through without a
// break.
func (m *Manager) heartbeatDone(ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case !ok:
		m.beatingSince = time.Time{}
	case m.beatingSince.IsZero():
		m.beatingSince = m.now()
	}
}

// mayJudgeNodes says whether this node may declare others down now: only
// once its own heartbeats have gone through for DownAfter. After an outage
// of the database (a failover) every node's heartbeat is old; a node that
// judged the others at once would declare down nodes that had no chance
// to write theirs since.
func (m *Manager) mayJudgeNodes() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.beatingSince.IsZero() && m.now().Sub(m.beatingSince) >= m.cfg.DownAfter
}

// heartbeat records that this node is alive until ctx ends; when another
// node declared it down meanwhile, it rejoins.
func (m *Manager) heartbeat(ctx context.Context) {
	t := time.NewTicker(m.heartbeatEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := m.st.HeartbeatNode(ctx, m.cfg.NodeID, m.now())
		if errors.Is(err, store.ErrNodeDown) {
			err = m.rejoin(ctx)
		}
		m.heartbeatDone(err == nil)
		if err == nil {
			err = m.drainIfAsked(ctx)
		}
		if err != nil && ctx.Err() == nil {
			m.log.Warn("node heartbeat", "node_id", m.cfg.NodeID, "err", err)
		}
	}
}

// TakesSandboxes says whether this node starts new sandboxes for the
// tasks whose jobs it takes: not while the operator has it cordoned or
// drained (placement keeps the API's creates off it already). A single
// node always does.
func (m *Manager) TakesSandboxes(ctx context.Context) bool {
	if m.cfg.DownAfter <= 0 {
		return true
	}
	n, err := m.st.GetNode(ctx, m.cfg.NodeID)
	return err != nil || n.Schedule == ""
}

// drainIfAsked stops this node's sandboxes when the operator drains it
// (sandboxd admin node drain): it takes no new ones either (placement
// skips it), so it empties.
func (m *Manager) drainIfAsked(ctx context.Context) error {
	n, err := m.st.GetNode(ctx, m.cfg.NodeID)
	if err != nil || n.Schedule != store.NodeDraining {
		return err
	}
	rows, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, store.SandboxPending, store.SandboxRunning)
	if err != nil || len(rows) == 0 {
		return err
	}
	m.log.Info("draining this node: stopping its sandboxes", "node_id", m.cfg.NodeID, "sandboxes", len(rows))
	return m.StopAll(ctx, "its node was drained")
}

// rejoin gives up what this node hosted when it was declared down, and
// records it up again.
func (m *Manager) rejoin(ctx context.Context) error {
	m.log.Warn("this node was declared down by another; destroying the sandboxes it hosted then", "node_id", m.cfg.NodeID)
	rows, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, activeStatuses...)
	if err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	live, err := m.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	// Sandboxes started here since it was declared down are its own.
	keep := map[string]bool{}
	for _, sb := range rows {
		keep[sb.ID] = true
	}
	m.destroyOrphans(ctx, live, keep)
	m.reconcileHooks(ctx, func(id string) bool { return keep[id] })
	if err := m.st.SetNodeUp(ctx, m.cfg.NodeID, m.now()); err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	m.log.Info("this node is up again", "node_id", m.cfg.NodeID)
	return nil
}

// watchNodes declares down the nodes whose heartbeat is older than
// DownAfter, and fails what each hosted, until ctx ends.
func (m *Manager) watchNodes(ctx context.Context) {
	t := time.NewTicker(max(m.cfg.DownAfter/4, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !m.mayJudgeNodes() {
			continue
		}
		now := m.now()
		down, err := m.st.MarkNodesDown(ctx, now.Add(-m.cfg.DownAfter), now)
		if err != nil && ctx.Err() == nil {
			m.log.Warn("watch nodes", "err", err)
		}
		for _, n := range down {
			if n.ID == m.cfg.NodeID {
				continue // its own heartbeat will find out and rejoin
			}
			if err := m.failNode(ctx, n); err != nil {
				m.log.Error("fail the sandboxes of a down node", "node_id", n.ID, "err", err)
			}
		}
	}
}

// failNode fails what node n, declared down, hosted.
func (m *Manager) failNode(ctx context.Context, n store.Node) error {
	silent := m.now().Sub(n.HeartbeatAt).Round(time.Second)
	m.log.Warn("node declared down", "node_id", n.ID, "address", n.Address, "silent_for", silent)
	rows, err := m.st.ListSandboxesByNode(ctx, n.ID, activeStatuses...)
	if err != nil {
		return err
	}
	reason := nodeDownReason(silent)
	gone := map[string]bool{}
	for _, sb := range rows {
		m.markFailed(ctx, sb.ID, activeStatuses, reason)
		gone[sb.ID] = true
	}
	var errs []error
	if err := m.runs.CrashRunsOf(ctx, gone, "the command's sandbox was lost with its node: "+reason); err != nil {
		errs = append(errs, err)
	}
	if err := m.cfg.Jobs.MoveQueue(ctx, jobs.NodeQueue(n.ID), river.QueueDefault); err != nil {
		errs = append(errs, err)
	}
	m.log.Info("failed the sandboxes of a down node", "node_id", n.ID, "sandboxes", len(rows))
	return errors.Join(errs...)
}
