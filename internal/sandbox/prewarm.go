package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Every real account has a snapshot after its first run, and a sandbox
// restored from one cannot come from the runtime's generic warm pool (the
// layers are overlay lowers, fixed at start). So the account's next
// sandboxes are started ahead from its snapshot (runtime.Prewarmer): when
// the snapshot is taken, and again when a create used one started ahead;
// as many as the account created from it in the last demandWindow (at
// least one, at most Settings.WarmPoolMax; the runtime's budget, serve's
// --prewarm, bounds them all).
// The runtime hands it only to a create of the same account whose spec
// would have made the same sandbox; the key, environment and workspace
// are the create's own (hooks), as for any sandbox.

// LayerSource is the persistence that knows an account's snapshot chain;
// package persist's Service is one.
type LayerSource interface {
	// Layers opens the chain of the account's current snapshot, bottom
	// first (none when it has no snapshot); release closes them.
	Layers(ctx context.Context, accountID string) (layers []runtime.Layer, snapshotID string, release func(), err error)
}

// baseSpec is what every sandbox of the account starts from, before the
// hooks add theirs (key, network, layers).
func (m *Manager) baseSpec(sb store.Sandbox) runtime.Spec {
	return runtime.Spec{
		ID: sb.ID, BaseDir: m.cfg.BaseDir, BaseImage: m.cfg.BaseID,
		Limits: m.cfg.Settings.Limits, HomeSocket: m.cfg.Home, Hostname: "sandbox",
		Owner: sb.AccountID,
	}
}

// prewarmer is the runtime's Prewarmer and persistence's LayerSource, or
// false when either is missing or sandboxes get a network by default (a
// prewarmed sandbox has none, so it would serve no create).
func (m *Manager) prewarmer() (runtime.Prewarmer, LayerSource, bool) {
	pw, ok := m.rt.(runtime.Prewarmer)
	if !ok || hasNetwork(m.cfg.Settings.Network) {
		return nil, nil, false
	}
	src, ok := m.cfg.Persist.(LayerSource)
	return pw, src, ok
}

// Prewarm starts the account's next sandbox from its current snapshot, in
// the background (called when one is taken: after a run, see
// prewarmAfterRun, and by the setup task). An account without a snapshot
// has nothing prewarmed.
func (m *Manager) Prewarm(accountID string) {
	if _, _, ok := m.prewarmer(); !ok {
		return
	}
	go m.prewarm(context.Background(), accountID)
}

// PrewarmRecent starts sandboxes ahead, one after another in the
// background, for the limit accounts whose snapshots changed last: after
// a restart (which destroys what was started ahead) their next creates are
// served warm too. The most recent is started last, so the budget's least
// recently used order keeps it longest.
func (m *Manager) PrewarmRecent(ctx context.Context, limit int) {
	if _, _, ok := m.prewarmer(); !ok || limit <= 0 {
		return
	}
	envs, err := m.st.RecentEnvironments(ctx, limit, m.now())
	if err != nil {
		m.log.Warn("prewarm: list the accounts with recent snapshots", "err", err)
		return
	}
	go func() {
		ctx := context.WithoutCancel(ctx)
		for i := len(envs) - 1; i >= 0; i-- {
			m.prewarm(ctx, envs[i].AccountID)
		}
	}()
}

// prewarmDemand is each account's recent creates from its snapshot, which
// size what is started ahead for it, and the accounts whose starts ahead
// are under way (one at a time per account).
type prewarmDemand struct {
	mu      sync.Mutex
	creates map[string][]time.Time // within demandWindow, oldest first
	running map[string]bool
	again   map[string]bool // a Prewarm came while one ran
}

// prewarmCreated records a create of the account from its snapshot.
func (m *Manager) prewarmCreated(accountID string) {
	d := &m.prewarmDemand
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.creates == nil {
		d.creates = map[string][]time.Time{}
	}
	now := m.now()
	d.creates[accountID] = append(d.creates[accountID], now)
	// An account that stopped creating keeps its last times until its
	// next Prewarm: sweep them when many accounts have some.
	if len(d.creates) > 1024 {
		for id, cs := range d.creates {
			if now.Sub(cs[len(cs)-1]) > demandWindow {
				delete(d.creates, id)
			}
		}
	}
}

// prewarmWanted is how many sandboxes the account's recent creates ask to
// be kept started ahead: as many as came in the last demandWindow, at
// least one, at most the warm pool's ceiling (Settings.WarmPoolMax); the
// runtime's budget bounds them all. Callers hold m.prewarmDemand.mu.
func (m *Manager) prewarmWantedLocked(accountID string) int {
	d := &m.prewarmDemand
	cs := d.creates[accountID]
	i := 0
	for i < len(cs) && m.now().Sub(cs[i]) > demandWindow {
		i++
	}
	if cs = cs[i:]; len(cs) == 0 {
		delete(d.creates, accountID)
	} else {
		d.creates[accountID] = cs
	}
	return min(max(len(cs), 1), max(m.cfg.Settings.WarmPoolMax, 1))
}

// prewarm starts the account's next sandboxes from its current snapshot,
// as many as its demand asks for (one after another: refilling takes one
// start's worth of the host beside the running sandboxes), and returns
// once they run, one failed, or none was needed. A Prewarm of the account
// while it runs makes it go round once more.
func (m *Manager) prewarm(ctx context.Context, accountID string) {
	d := &m.prewarmDemand
	d.mu.Lock()
	if d.running[accountID] {
		d.again[accountID] = true
		d.mu.Unlock()
		return
	}
	if d.running == nil {
		d.running, d.again = map[string]bool{}, map[string]bool{}
	}
	d.running[accountID] = true
	for {
		want := m.prewarmWantedLocked(accountID)
		delete(d.again, accountID)
		d.mu.Unlock()
		m.prewarmUpTo(ctx, accountID, want)
		d.mu.Lock()
		if !d.again[accountID] {
			delete(d.running, accountID)
			d.mu.Unlock()
			return
		}
	}
}

// prewarmUpTo has up to want sandboxes kept started for the account.
func (m *Manager) prewarmUpTo(ctx context.Context, accountID string, want int) {
	for i := range want {
		if i > 0 {
			// Beyond the first, only within the room a create keeps.
			if free, ok := m.warmRoom(ctx); !ok || free <= 0 {
				return
			}
		}
		if started, ok := m.prewarmOne(ctx, accountID, want); !started || !ok {
			return
		}
	}
}

// prewarmOne starts one of the account's next sandboxes from its current
// snapshot when fewer than want are kept; ok is false when it could not.
func (m *Manager) prewarmOne(ctx context.Context, accountID string, want int) (started, ok bool) {
	pw, src, ok := m.prewarmer()
	if !ok {
		return false, false
	}
	layers, snapID, release, err := src.Layers(ctx, accountID)
	if err != nil {
		m.log.Warn("prewarm: open account snapshot", "account_id", accountID, "err", err)
		return false, false
	}
	defer release()
	if len(layers) == 0 {
		m.dropPrewarmed(ctx, accountID)
		return false, true
	}
	// Its disk is promised like a new sandbox's: no room, no prewarm.
	// (The promise counts from the moment Prewarm records it, just
	// after the check: the window is a few instructions wide.)
	admitted, err := m.admitDisk(ctx, 1)
	if err != nil {
		m.log.Info("prewarm: no disk to promise; the account's next create starts cold", "account_id", accountID, "err", err)
		return false, false
	}
	admitted()
	spec := m.baseSpec(store.Sandbox{AccountID: accountID})
	spec.ID, spec.Layers = "", layers
	started, err = pw.Prewarm(ctx, spec, want)
	if err != nil {
		m.log.Warn("prewarm a sandbox", "account_id", accountID, "snapshot_id", snapID, "err", err)
		return false, false
	}
	if started {
		m.log.Debug("sandbox prewarmed", "account_id", accountID, "snapshot_id", snapID, "want", want)
	}
	return started, true
}

// dropPrewarmed destroys what the runtime keeps started for the account.
func (m *Manager) dropPrewarmed(ctx context.Context, accountID string) {
	pw, ok := m.rt.(runtime.Prewarmer)
	if !ok {
		return
	}
	if err := pw.DropPrewarmed(ctx, accountID); err != nil && !errors.Is(err, context.Canceled) {
		m.log.Warn("drop prewarmed sandbox", "account_id", accountID, "err", err)
	}
}

var (
	prewarmKeptDesc = prometheus.NewDesc("sandboxd_prewarm_kept",
		"Sandboxes started ahead from their accounts' snapshots, kept or starting on this node.", nil, nil)
	prewarmEventsDesc = prometheus.NewDesc("sandboxd_prewarm_total",
		"What became of the sandboxes started ahead on this node: started, failed, taken (by a create; waited: after it waited for the start), discarded (unused: superseded, stale, evicted, dropped).", []string{"event"}, nil)
)

// PrewarmMetrics is a Prometheus collector of the runtime's prewarmed
// sandboxes (nothing when the runtime does not prewarm) and of its pools
// (tplpool.go).
func (m *Manager) PrewarmMetrics() prometheus.Collector { return prewarmCollector{m} }

type prewarmCollector struct{ m *Manager }

func (c prewarmCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- prewarmKeptDesc
	ch <- prewarmEventsDesc
	ch <- poolReadyDesc
	ch <- poolEventsDesc
	ch <- poolTemplatesDesc
}

func (c prewarmCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.collectPools(ch)
	pw, ok := c.m.rt.(runtime.Prewarmer)
	if !ok {
		return
	}
	st := pw.PrewarmStats()
	ch <- prometheus.MustNewConstMetric(prewarmKeptDesc, prometheus.GaugeValue, float64(st.Kept))
	for event, n := range map[string]uint64{"started": st.Started, "failed": st.Failed, "taken": st.Taken, "waited": st.Waited, "discarded": st.Discarded} {
		ch <- prometheus.MustNewConstMetric(prewarmEventsDesc, prometheus.CounterValue, float64(n), event)
	}
}

// prewarmAfterRun is persistence as the manager's runs see it: a run whose
// work became the account's snapshot starts the account's next sandbox
// from it.
type prewarmAfterRun struct {
	persist runs.AfterRunner
	m       *Manager
}

func (p prewarmAfterRun) AfterRun(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, run store.Run) (runs.Saved, error) {
	saved, err := p.persist.AfterRun(ctx, sb, rsb, run)
	if err == nil && saved.SnapshotID != "" {
		p.m.Prewarm(sb.AccountID)
	}
	return saved, err
}
