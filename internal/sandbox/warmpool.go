package sandbox

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The built-in warm pool (the runtime's sandboxes of the server's image,
// for the creates that start fresh: no template, no snapshot, no network)
// keeps Settings.WarmSandboxes started ahead at least, and as many as such
// creates came in the last demandWindow, up to Settings.WarmPoolMax: a
// burst of creates is followed by a pool its size, so the next burst finds
// its sandboxes ready; a minute without one brings the pool back to its
// floor. The pool grows only within the disk admission's room (each warm
// sandbox is promised a disk of Limits.DiskBytes, as a running one is),
// keeping one create's room free; and a create the disk could not promise
// otherwise makes the pool give back what it grew (yieldWarm), so a bigger
// pool never turns a create away. The runtime starts what the pool lacks
// one at a time, so refilling takes one start's worth of the host beside
// the running sandboxes.

// warmDemand is the recent creates the built-in pool could serve, and the
// size it was given.
type warmDemand struct {
	mu      sync.Mutex
	creates []time.Time // within demandWindow, oldest first
	size    int
	sizing  bool // a sizeWarmPool runs
	again   bool // a create came while it ran
}

// warmSizer is the runtime's WarmSizer, or false when it has none or the
// operator asked for no warm pool (its floor is 0) or no growth.
func (m *Manager) warmSizer() (runtime.WarmSizer, bool) {
	ws, ok := m.rt.(runtime.WarmSizer)
	if !ok || m.cfg.Settings.WarmSandboxes <= 0 || m.cfg.Settings.WarmPoolMax <= m.cfg.Settings.WarmSandboxes {
		return nil, false
	}
	return ws, true
}

// warmCreated records a create the built-in pool could have served, then
// sizes the pool in the background.
func (m *Manager) warmCreated() {
	if _, ok := m.warmSizer(); !ok {
		return
	}
	d := &m.warm
	d.mu.Lock()
	d.creates = append(d.creates, m.now())
	d.mu.Unlock()
	go m.sizeWarmPool(context.Background())
}

// warmWantedLocked is the size the recent creates ask for, within the
// operator's floor and ceiling; callers hold m.warm.mu.
func (m *Manager) warmWantedLocked(now time.Time) int {
	d := &m.warm
	i := 0
	for i < len(d.creates) && now.Sub(d.creates[i]) > demandWindow {
		i++
	}
	d.creates = d.creates[i:]
	return min(max(len(d.creates), m.cfg.Settings.WarmSandboxes), m.cfg.Settings.WarmPoolMax)
}

// sizeWarmPool gives the built-in pool the size recent demand asks for,
// within the node's disk: it grows only as far as the disk can promise the
// new sandboxes and one create more, and shrinks (towards its floor) when
// creates took that room. One sizing runs at a time; a create during it is
// counted before it ends.
func (m *Manager) sizeWarmPool(ctx context.Context) {
	ws, ok := m.warmSizer()
	if !ok {
		return
	}
	d := &m.warm
	d.mu.Lock()
	if d.sizing {
		d.again = true // the sizing under way goes round once more
		d.mu.Unlock()
		return
	}
	d.sizing = true
	for {
		want := m.warmWantedLocked(m.now())
		cur := max(d.size, m.cfg.Settings.WarmSandboxes)
		d.again = false
		d.mu.Unlock()
		// Within the disk: growth while a create's room stays, and back
		// towards the floor when creates took that room meanwhile.
		if free, ok := m.warmRoom(ctx); ok {
			want = max(m.cfg.Settings.WarmSandboxes, min(want, cur+free))
		} else if want > cur {
			want = cur
		}
		d.mu.Lock()
		if want != d.size {
			d.size = want
			m.log.Debug("warm pool sized", "size", want)
			ws.SetWarmSize(want)
		}
		if !d.again {
			d.sizing = false
			d.mu.Unlock()
			return
		}
	}
}

// warmRoom is how many more sandboxes the node's disk can promise while
// keeping room for one create (negative: that many too many); ok is false
// when the disk cannot be measured.
func (m *Manager) warmRoom(ctx context.Context) (free int, ok bool) {
	limit := m.cfg.Settings.Limits.DiskBytes
	if limit <= 0 || m.cfg.DataDir == "" {
		return math.MaxInt32, true
	}
	m.diskMu.Lock()
	b, err := m.balance(ctx)
	m.diskMu.Unlock()
	if err != nil {
		m.log.Warn("warm pool: measure the disk", "err", err)
		return 0, false
	}
	room := b.room()
	if room < 0 {
		return int(room/limit) - 2, true // rounds towards zero: one more
	}
	return int(room/limit) - 1, true
}

// yieldWarm shrinks the built-in pool by up to n sandboxes, not below
// its floor, for a create the disk cannot otherwise promise (a warm
// sandbox is a guess; a create is a caller): it answers how many went.
// Callers hold m.diskMu.
func (m *Manager) yieldWarm(n int) int {
	ws, ok := m.warmSizer()
	if !ok {
		return 0
	}
	d := &m.warm
	d.mu.Lock()
	defer d.mu.Unlock()
	cur := max(d.size, m.cfg.Settings.WarmSandboxes)
	n = min(n, cur-m.cfg.Settings.WarmSandboxes)
	if n <= 0 {
		return 0
	}
	d.size = cur - n
	m.log.Debug("warm pool yields to a create", "size", d.size)
	ws.SetWarmSize(d.size)
	return n
}

// warmPooled is what the built-in pool holds, starts or is filling to,
// at least its floor (admitDisk counts them as promised).
func (m *Manager) warmPooled() int {
	warm := m.cfg.Settings.WarmSandboxes
	if pl, ok := m.rt.(runtime.Pooler); ok {
		st := pl.PoolStats().Warm
		warm = max(warm, st.Size, st.Ready+st.Starting)
	}
	return warm
}
