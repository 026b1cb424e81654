package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A custom template's sandboxes start from its own root filesystem and
// layers, which the built-in warm pool and the accounts' prewarmed
// sandboxes are not of. So the templates in demand get pools of their own
// (runtime.Pooler), sized by their recent creates within
// Settings.TemplatePool sandboxes in all, for at most maxTemplatePools
// templates, the least recently used dropped first; a template's pool
// goes templateIdle after its last create. The built-in warm pool keeps
// its own size: the templates' never take from it.
//
// A pooled sandbox is the template's filesystem started, nothing more: no
// owner, no network (pools serve creates without one, as the warm pool
// does), no key. What differs between two creates of a template is the
// claim's (its id, environment and connection home, written when it is
// handed out and given to every process). The template's start command
// runs after the hand-out, as on a cold start: it then runs with the
// sandbox's own environment (its key) and as the sandbox's own process,
// so a pooled sandbox is indistinguishable from a cold one. (Keeping the
// start command running in the pool would save its ready wait, but the
// process would hold another environment than the sandbox's and would
// have run for nobody's sandbox; a memory snapshot of the started
// template is the way to that, later.)

const (
	// maxTemplatePools bounds the templates with a pool on a node.
	maxTemplatePools = 8
	// templateIdle is how long a template's pool stays after its last
	// create.
	templateIdle = 10 * time.Minute
	// demandWindow is the time over which a template's creates are
	// counted to size its pool: a pool holds as many sandboxes as the
	// template had creates in the last minute, at least minTemplatePool,
	// within the budget.
	demandWindow = time.Minute
	// minTemplatePool is what a template in use wants at least (the
	// built-in warm pool's default size): with one, the create after a
	// hit finds the pool still refilling.
	minTemplatePool = 2
	// templatePoolsTick is how often idle pools are dropped and the
	// pooled templates checked (a deleted one's pool goes).
	templatePoolsTick = 30 * time.Second
)

// templatePools is the demand for each template with a pool, or that had
// one lately.
type templatePools struct {
	mu     sync.Mutex
	byID   map[string]*templateDemand
	misses uint64 // template creates that found no pool for it
}

// templateDemand is one template's recent creates and the size its pool
// was given.
type templateDemand struct {
	creates []time.Time // within demandWindow, oldest first
	last    time.Time
	size    int
}

// pooler is the runtime's Pooler, or false when the runtime has none or
// the operator gave templates no pool.
func (m *Manager) pooler() (runtime.Pooler, bool) {
	p, ok := m.rt.(runtime.Pooler)
	if !ok || m.cfg.Settings.TemplatePool <= 0 || m.cfg.Templates == nil {
		return nil, false
	}
	return p, true
}

// templateCreated records a create of template id that a pool could have
// served (no network), then sizes the pools: its own, when it had none,
// starts filling in the background.
func (m *Manager) templateCreated(id string) {
	pl, ok := m.pooler()
	if !ok {
		return
	}
	tp := &m.tplPools
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.byID == nil {
		tp.byID = map[string]*templateDemand{}
	}
	d := tp.byID[id]
	if d == nil {
		d = &templateDemand{}
		tp.byID[id] = d
	}
	if d.size == 0 {
		tp.misses++
	}
	now := m.now()
	d.creates, d.last = append(d.creates, now), now
	m.sizeTemplatePoolsLocked(pl, now)
}

// sizeTemplatePoolsLocked gives the budget to the templates most recently
// created from: one sandbox each, in that order, then one more at a time
// to the template whose pool is furthest below what it wants (its last
// minute's creates, at least minTemplatePool; a tie goes to the one with
// more creates, then to the more recent).
// Pools whose size changed are told so; a template past templateIdle (or
// beyond maxTemplatePools) loses its pool. Callers hold tp.mu.
func (m *Manager) sizeTemplatePoolsLocked(pl runtime.Pooler, now time.Time) {
	tp := &m.tplPools
	ids := make([]string, 0, len(tp.byID))
	for id, d := range tp.byID {
		i := 0
		for i < len(d.creates) && now.Sub(d.creates[i]) > demandWindow {
			i++
		}
		d.creates = d.creates[i:]
		if now.Sub(d.last) <= templateIdle {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b string) int { return tp.byID[b].last.Compare(tp.byID[a].last) })
	budget := m.cfg.Settings.TemplatePool
	ids = ids[:min(len(ids), maxTemplatePools, budget)]
	alloc := make(map[string]int, len(ids))
	for _, id := range ids {
		alloc[id] = 1
		budget--
	}
	for ; budget > 0; budget-- {
		best, gap := "", 0
		for _, id := range ids {
			n := len(tp.byID[id].creates)
			g := max(n, minTemplatePool) - alloc[id]
			if g > gap || g == gap && g > 0 && n > len(tp.byID[best].creates) {
				best, gap = id, g
			}
		}
		if best == "" {
			break
		}
		alloc[best]++
	}
	for id, d := range tp.byID {
		size := alloc[id]
		if size != d.size {
			pl.SetPool(id, size, m.templateOpener(id))
			d.size = size
		}
		if size == 0 && now.Sub(d.last) > templateIdle {
			delete(tp.byID, id)
		}
	}
}

// dropTemplatePool removes template id's pool (its template is gone).
func (m *Manager) dropTemplatePool(pl runtime.Pooler, id string) {
	tp := &m.tplPools
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if _, ok := tp.byID[id]; ok {
		pl.SetPool(id, 0, nil)
		delete(tp.byID, id)
	}
}

// templateOpener makes the spec of template id's pooled sandboxes: the
// spec of a create from it (fromTemplate) without the claim's parts (id,
// owner, key, connection home) and without a network. Each start is
// admitted on the node's disk as a create is (the pool's sandboxes count
// as warm ones, the one starting already among them: poolDiskRoom).
func (m *Manager) templateOpener(id string) func(ctx context.Context) (runtime.Spec, func(), error) {
	return func(ctx context.Context) (runtime.Spec, func(), error) {
		if err := m.poolDiskRoom(ctx); err != nil {
			return runtime.Spec{}, func() {}, err
		}
		spec := m.baseSpec(store.Sandbox{})
		spec.HomeSocket = ""
		_, release, err := m.fromTemplate(ctx, store.Sandbox{TemplateID: id}, &spec)
		return spec, release, err
	}
}

// poolDiskRoom checks that the node's disk can hold what it promised, the
// pooled sandbox starting now included (it counts as warm while it
// starts), and one sandbox more: a pool never takes the last place a
// create could have (admitDisk's rule, without counting a refusal).
func (m *Manager) poolDiskRoom(ctx context.Context) error {
	m.diskMu.Lock()
	defer m.diskMu.Unlock()
	if m.cfg.DataDir == "" {
		return nil
	}
	b, err := m.balance(ctx)
	if err != nil {
		return err
	}
	if b.room() < max(0, m.cfg.Settings.Limits.DiskBytes) {
		return errdefs.Newf(errdefs.ErrQuota, "the server's disk cannot hold another pooled sandbox and a create: %s", b)
	}
	return nil
}

// keepPools tends the pools every templatePoolsTick until ctx ends: the
// templates' (idle and deleted templates lose theirs) and the built-in
// warm pool (demand that passed brings it back to its floor, warmpool.go).
func (m *Manager) keepPools(ctx context.Context) {
	_, templates := m.pooler()
	_, warm := m.warmSizer()
	if !templates && !warm {
		return
	}
	t := time.NewTicker(templatePoolsTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if templates {
				m.tendTemplatePools(ctx)
			}
			if warm {
				m.sizeWarmPool(ctx)
			}
		}
	}
}

// tendTemplatePools drops the pools of templates idle for templateIdle
// and of templates deleted.
func (m *Manager) tendTemplatePools(ctx context.Context) {
	pl, ok := m.pooler()
	if !ok {
		return
	}
	m.tplPools.mu.Lock()
	m.sizeTemplatePoolsLocked(pl, m.now())
	ids := make([]string, 0, len(m.tplPools.byID))
	for id := range m.tplPools.byID {
		ids = append(ids, id)
	}
	m.tplPools.mu.Unlock()
	for _, id := range ids {
		if _, err := m.cfg.Templates.ByID(ctx, id); errors.Is(err, errdefs.ErrNotFound) {
			m.dropTemplatePool(pl, id)
		}
	}
}

// templatePooled counts the sandboxes the templates' pools hold or start
// (disk admission counts them as warm).
func (m *Manager) templatePooled() int {
	pl, ok := m.rt.(runtime.Pooler)
	if !ok {
		return 0
	}
	n := 0
	for _, st := range pl.PoolStats().Pools {
		n += st.Ready + st.Starting
	}
	return n
}

var (
	poolReadyDesc = prometheus.NewDesc("sandboxd_pool_ready",
		"Sandboxes started ahead and waiting for a create on this node, by pool: builtin (the warm pool of the server's image) or template (the custom templates' pools, all of them).", []string{"pool"}, nil)
	poolEventsDesc = prometheus.NewDesc("sandboxd_pool_total",
		"Creates a pool served (hit; waited: of those, after waiting for the sandbox's start) or could have served but had none ready or starting, or no pool yet for a template (miss), and what became of the pools' sandboxes (started, failed, discarded: unused, the pool shrank or went), by pool: builtin or template.", []string{"pool", "event"}, nil)
	poolTemplatesDesc = prometheus.NewDesc("sandboxd_pool_templates",
		"Custom templates with a pool on this node.", nil, nil)
)

// collectPools reports the runtime's pools (nothing when it has none).
func (m *Manager) collectPools(ch chan<- prometheus.Metric) {
	pl, ok := m.rt.(runtime.Pooler)
	if !ok {
		return
	}
	rep := pl.PoolStats()
	tpl := rep.Removed
	tpl.Ready, tpl.Starting = 0, 0
	for _, st := range rep.Pools {
		tpl.Ready += st.Ready
		tpl.Hits += st.Hits
		tpl.Waited += st.Waited
		tpl.Misses += st.Misses
		tpl.Started += st.Started
		tpl.Failed += st.Failed
		tpl.Discarded += st.Discarded
	}
	m.tplPools.mu.Lock()
	tpl.Misses += m.tplPools.misses
	m.tplPools.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(poolTemplatesDesc, prometheus.GaugeValue, float64(len(rep.Pools)))
	for pool, st := range map[string]runtime.PoolStats{"builtin": rep.Warm, "template": tpl} {
		ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(st.Ready), pool)
		for event, n := range map[string]uint64{"hit": st.Hits, "waited": st.Waited, "miss": st.Misses, "started": st.Started, "failed": st.Failed, "discarded": st.Discarded} {
			ch <- prometheus.MustNewConstMetric(poolEventsDesc, prometheus.CounterValue, float64(n), pool, event)
		}
	}
}
