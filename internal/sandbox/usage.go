package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The resource use of this node's running sandboxes over time, for E2B's
// metrics with a range (getMetrics({start, end})): each is measured every
// UsageEvery from its cgroup, the last maxUsageSamples kept in memory (an
// hour at 5 s). A paused sandbox is not measured (it uses nothing, and a
// measure would wake it); a sandbox's history goes when it stops running
// here, and all of it with the process.

// maxUsageSamples bounds one sandbox's history.
const maxUsageSamples = 720

// DefaultUsageEvery is how often running sandboxes are measured.
const DefaultUsageEvery = 5 * time.Second

// UsageSample is one measure of a sandbox.
type UsageSample struct {
	At time.Time
	// CPU is the CPU time it used since it started (the share over a
	// span is the difference between two samples).
	CPU         time.Duration
	MemoryBytes int64
	DiskBytes   int64
}

// usageHistory is the samples of each running sandbox of this node.
type usageHistory struct {
	mu      sync.Mutex
	samples map[string][]UsageSample
}

func (h *usageHistory) add(id string, s UsageSample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.samples == nil {
		h.samples = map[string][]UsageSample{}
	}
	l := append(h.samples[id], s)
	if len(l) > maxUsageSamples {
		l = append(l[:0:0], l[len(l)-maxUsageSamples:]...)
	}
	h.samples[id] = l
}

// keepOnly drops the histories of sandboxes not in live.
func (h *usageHistory) keepOnly(live map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.samples {
		if !live[id] {
			delete(h.samples, id)
		}
	}
}

// between is id's samples taken in [from, to] (a zero bound is open).
func (h *usageHistory) between(id string, from, to time.Time) []UsageSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []UsageSample
	for _, s := range h.samples[id] {
		if (from.IsZero() || !s.At.Before(from)) && (to.IsZero() || !s.At.After(to)) {
			out = append(out, s)
		}
	}
	return out
}

// measureUsage measures this node's running, unpaused sandboxes every
// UsageEvery until ctx ends.
func (m *Manager) measureUsage(ctx context.Context) {
	every := m.cfg.Settings.UsageEvery
	if every <= 0 {
		every = DefaultUsageEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		running, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, store.SandboxRunning)
		if err != nil {
			if ctx.Err() == nil {
				m.log.Warn("usage: list running sandboxes", "err", err)
			}
			continue
		}
		live := map[string]bool{}
		for _, sb := range running {
			live[sb.ID] = true
			if sb.Pause != "" {
				continue
			}
			rsb, err := m.rt.Get(ctx, sb.ID)
			if err != nil {
				continue
			}
			mctx, cancel := context.WithTimeout(ctx, every)
			st, err := rsb.Stats(mctx)
			cancel()
			if err != nil {
				continue // stopped meanwhile, or paused
			}
			m.usage.add(sb.ID, UsageSample{At: m.now(), CPU: st.CPU, MemoryBytes: st.MemoryBytes, DiskBytes: st.DiskBytes})
		}
		m.usage.keepOnly(live)
	}
}

// UsageHistory is running sandbox id's measures taken in [from, to] (zero
// bounds are open), oldest first, under the one access rule; the sandbox
// must be hosted here (the front ends forward to its node).
func (m *Manager) UsageHistory(ctx context.Context, p auth.Principal, id string, from, to time.Time) ([]UsageSample, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	if sb.NodeID != m.cfg.NodeID {
		return nil, fmt.Errorf("sandbox %s is hosted on node %s: %w", sb.ID, sb.NodeID, errdefs.ErrNotRunning)
	}
	return m.usage.between(sb.ID, from, to), nil
}
