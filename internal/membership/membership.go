// Package membership is a node's membership of a cluster: every node
// registers itself (where the others reach it, what it offers) and
// heartbeats; every node also watches the others, and the first to see a
// node silent for DownAfter declares it down (a compare-and-set in the
// database: one declarer per node, no consensus of our own) and has what it
// hosted failed: its active sandboxes become failed with the reason (their
// keys revoked by the stop hooks), their executing runs CRASHED, and the
// jobs queued for it move to the shared queue, where another node finishes
// them cleanly. A node that learns it was declared down (its heartbeat is
// refused, or its registration after a restart) gives up what it hosted —
// destroys its runtime sandboxes that have no active row of its own any
// more — and only then is up again: it never resurrects a failed sandbox.
//
// A single node registers and heartbeats too (the operator's drain reaches
// it through its row), but judges nobody (DownAfter 0).
//
// What happens to the sandboxes is package sandbox's (Sandboxes); this
// package decides when, and owns the node rows' lifecycle. Package cluster
// reads those rows to place and forward.
package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// NodeInfo is what a node registers besides its id.
type NodeInfo struct {
	Address  string // its cluster listener, as other nodes reach it ("": none)
	Capacity store.NodeCapacity
	Version  string
}

// Sandboxes is what membership has done to sandboxes (sandbox.Manager).
type Sandboxes interface {
	// StopAll stops every active sandbox of this node (a drain).
	StopAll(ctx context.Context, reason string) error
	// FailHostedBy fails the active sandboxes of node id, declared down,
	// with reason, and crashes their executing runs; it returns how many
	// sandboxes it failed.
	FailHostedBy(ctx context.Context, id, reason string) (int, error)
	// DestroyOrphans destroys this node's runtime sandboxes (and what
	// the hooks made for them) that no active row of this node stands
	// for.
	DestroyOrphans(ctx context.Context) error
}

// Jobs moves the queued jobs of a node declared down (jobs.Client).
type Jobs interface {
	MoveQueue(ctx context.Context, from, to string) error
}

// Builds takes over the template builds of a node declared down
// (templates.Service): their jobs are held by that node's worker, which
// MoveQueue does not move.
type Builds interface {
	AdoptBuilds(ctx context.Context, nodeID string) (int, error)
}

// Config builds a Membership.
type Config struct {
	Store  *store.Store
	NodeID string
	// Node is what this node registers for the others: where they reach
	// it and what it offers.
	Node NodeInfo
	// DownAfter is how long a node's heartbeat may be silent before this
	// node declares it down and fails what it hosted (0: never; a single
	// node has nobody to watch).
	DownAfter time.Duration
	Sandboxes Sandboxes
	Jobs      Jobs
	// Builds takes over a down node's template builds (nil: none).
	Builds Builds
	Logger *slog.Logger
}

// Membership keeps this node registered and alive, and watches the others.
type Membership struct {
	cfg Config
	st  *store.Store
	log *slog.Logger
	now func() time.Time

	// beatingSince is since when this node's heartbeats have gone through
	// without a break (under mu).
	mu           sync.Mutex
	beatingSince time.Time
}

// New returns a Membership; Run starts it.
func New(cfg Config) *Membership {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Membership{cfg: cfg, st: cfg.Store, log: cfg.Logger, now: time.Now}
}

// Run registers the node and keeps it alive for the others (and, in a
// cluster, watches theirs) until ctx ends. Call it after the sandboxes are
// reconciled.
func (m *Membership) Run(ctx context.Context) error {
	if err := m.Register(ctx); err != nil {
		return err
	}
	if m.cfg.DownAfter > 0 {
		go m.watchNodes(ctx)
	}
	m.heartbeat(ctx)
	return nil
}

// heartbeatEvery is how often a node says it is alive: often enough that
// a node down for DownAfter misses several.
func (m *Membership) heartbeatEvery() time.Duration {
	if d := m.cfg.DownAfter / 4; d > 0 && d < 10*time.Second {
		return d
	}
	return 10 * time.Second
}

// Register records this node as up, giving up first what it hosted if it
// was declared down while it was away.
func (m *Membership) Register(ctx context.Context) error {
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
func (m *Membership) heartbeatDone(ok bool) {
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
func (m *Membership) mayJudgeNodes() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.beatingSince.IsZero() && m.now().Sub(m.beatingSince) >= m.cfg.DownAfter
}

// heartbeat records that this node is alive until ctx ends; when another
// node declared it down meanwhile, it rejoins.
func (m *Membership) heartbeat(ctx context.Context) {
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
func (m *Membership) TakesSandboxes(ctx context.Context) bool {
	if m.cfg.DownAfter <= 0 {
		return true
	}
	n, err := m.st.GetNode(ctx, m.cfg.NodeID)
	return err != nil || n.Schedule == ""
}

// drainIfAsked stops this node's sandboxes when the operator drains it
// (sandboxd admin node drain): it takes no new ones either (placement
// skips it), so it empties.
func (m *Membership) drainIfAsked(ctx context.Context) error {
	n, err := m.st.GetNode(ctx, m.cfg.NodeID)
	if err != nil || n.Schedule != store.NodeDraining {
		return err
	}
	rows, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, store.SandboxPending, store.SandboxRunning)
	if err != nil {
		return err
	}
	// One paused with its files alone is not on this node: it stays.
	rows = slices.DeleteFunc(rows, store.Sandbox.FilesPaused)
	if len(rows) == 0 {
		return nil
	}
	m.log.Info("draining this node: stopping its sandboxes", "node_id", m.cfg.NodeID, "sandboxes", len(rows))
	return m.cfg.Sandboxes.StopAll(ctx, "its node was drained")
}

// rejoin gives up what this node hosted when it was declared down, and
// records it up again.
func (m *Membership) rejoin(ctx context.Context) error {
	m.log.Warn("this node was declared down by another; destroying the sandboxes it hosted then", "node_id", m.cfg.NodeID)
	// Sandboxes started here since it was declared down are its own.
	if err := m.cfg.Sandboxes.DestroyOrphans(ctx); err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	if err := m.st.SetNodeUp(ctx, m.cfg.NodeID, m.now()); err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	m.log.Info("this node is up again", "node_id", m.cfg.NodeID)
	return nil
}

// watchNodes declares down the nodes whose heartbeat is older than
// DownAfter, and fails what each hosted, until ctx ends.
func (m *Membership) watchNodes(ctx context.Context) {
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

// failNode fails what node n, declared down, hosted, moves its queued
// jobs to the shared queue and has its template builds built elsewhere.
func (m *Membership) failNode(ctx context.Context, n store.Node) error {
	silent := m.now().Sub(n.HeartbeatAt).Round(time.Second)
	m.log.Warn("node declared down", "node_id", n.ID, "address", n.Address, "silent_for", silent)
	count, err := m.cfg.Sandboxes.FailHostedBy(ctx, n.ID, downReason(silent))
	errs := []error{err}
	if err := m.cfg.Jobs.MoveQueue(ctx, jobs.NodeQueue(n.ID), river.QueueDefault); err != nil {
		errs = append(errs, err)
	}
	builds := 0
	if m.cfg.Builds != nil {
		b, err := m.cfg.Builds.AdoptBuilds(ctx, n.ID)
		builds = b
		errs = append(errs, err)
	}
	m.log.Info("failed the sandboxes of a down node", "node_id", n.ID, "sandboxes", count, "template_builds_taken_over", builds)
	return errors.Join(errs...)
}

// downReason is the reason of the sandboxes of a node that stopped
// answering for silent: the node's id and address mean nothing to a user
// (and are the operator's to see, in the log).
func downReason(silent time.Duration) string {
	return fmt.Sprintf("its node stopped answering (no heartbeat for %v); its processes and unsaved work are lost", silent)
}
