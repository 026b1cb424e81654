package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Pools are a backend's pools of sandboxes started ahead for chosen specs
// (runtime.Pooler): each named and sized by its caller, refilled in the
// background, and handed to a create whose spec has the runtime.PoolKey
// of the specs its sandboxes were started from. The backend starts their
// sandboxes (start, with no id claimed) and turns a taken one into the new
// sandbox, as it does a warm one.
//
// Starts take turns over all pools: a pool being filled never starts a
// second sandbox beside the first, nor beside another pool's, so the
// background work is one sandbox start at a time whatever the number of
// pools (the built-in warm pool fills on its own, and is never waited for).
type Pools[S Served] struct {
	ctx   context.Context // ends with the runtime
	start func(ctx context.Context, spec runtime.Spec) (S, error)
	// complete fills a spec's defaults as Create does (limits, hostname),
	// so that a pool's key is the one a create's spec will have.
	complete func(spec *runtime.Spec)
	log      *slog.Logger
	turn     chan struct{} // one start at a time over all pools
	backoff  Backoff

	mu      sync.Mutex
	pools   map[string]*namedPool[S]
	removed runtime.PoolStats // the counts of the pools removed
	closed  bool
	wg      sync.WaitGroup
}

// namedPool is one pool's sandboxes and its filler.
type namedPool[S Served] struct {
	// key is the runtime.PoolKey of the spec its ready sandboxes were
	// started from ("" before the first start).
	key      string
	size     int
	open     func(ctx context.Context) (runtime.Spec, func(), error)
	ready    []S
	starting int
	// waiters are the creates waiting for a sandbox under way (at most
	// one each), first come first served; a channel closed without a
	// sandbox says the start failed.
	waiters []chan S
	kick    chan struct{}
	cancel  context.CancelFunc
	stats   runtime.PoolStats
}

// NewPools makes the pools of a backend whose context is ctx (their
// fillers end with it); start starts a sandbox with no id, complete fills
// a spec's defaults as the backend's Create does.
func NewPools[S Served](ctx context.Context, log *slog.Logger, start func(context.Context, runtime.Spec) (S, error), complete func(*runtime.Spec)) *Pools[S] {
	return &Pools[S]{
		ctx: ctx, start: start, complete: complete, log: log, turn: make(chan struct{}, 1),
		backoff: Backoff{First: time.Second, Max: time.Minute},
		pools:   map[string]*namedPool[S]{},
	}
}

// Set implements runtime.Pooler.SetPool.
func (p *Pools[S]) Set(name string, size int, open func(ctx context.Context) (runtime.Spec, func(), error)) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	np, ok := p.pools[name]
	var drop []S
	switch {
	case size <= 0 && !ok:
	case size <= 0:
		delete(p.pools, name)
		np.cancel()
		drop = np.ready
		np.stats.Discarded += uint64(len(drop))
		np.ready = nil
		np.releaseWaiters(0)
		p.retireLocked(np)
	case !ok:
		ctx, cancel := context.WithCancel(p.ctx)
		np = &namedPool[S]{size: size, open: open, kick: make(chan struct{}, 1), cancel: cancel}
		np.stats.Name = name
		p.pools[name] = np
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.fill(ctx, name, np)
		}()
	default:
		np.size, np.open = size, open
		if n := len(np.ready) - size; n > 0 {
			// The oldest go: they have waited longest.
			drop = append(drop, np.ready[:n]...)
			np.ready = append([]S(nil), np.ready[n:]...)
			np.stats.Discarded += uint64(n)
		}
		np.wake()
	}
	p.mu.Unlock()
	if len(drop) > 0 {
		go func() { _ = destroyAll(drop) }()
	}
}

// releaseWaiters lets all but the first keep waiters go without a
// sandbox (they start theirs cold), counting their misses.
func (np *namedPool[S]) releaseWaiters(keep int) {
	for len(np.waiters) > keep {
		last := len(np.waiters) - 1
		close(np.waiters[last])
		np.waiters = np.waiters[:last]
		np.stats.Misses++
	}
}

func (np *namedPool[S]) wake() {
	select {
	case np.kick <- struct{}{}:
	default:
	}
}

// fill keeps np at its size until its context ends (the pool removed, or
// the runtime closed).
func (p *Pools[S]) fill(ctx context.Context, name string, np *namedPool[S]) {
	backoff := p.backoff
	for {
		p.mu.Lock()
		need := np.size - len(np.ready) - np.starting
		open := np.open
		if need > 0 {
			np.starting++
		}
		p.mu.Unlock()
		if need <= 0 {
			select {
			case <-ctx.Done():
				return
			case <-np.kick:
				continue
			}
		}
		s, spec, err := p.startOne(ctx, open)
		p.mu.Lock()
		np.starting--
		if err != nil {
			// Those waiting beyond the starts still under way go cold.
			np.releaseWaiters(np.starting)
			if ctx.Err() != nil {
				p.mu.Unlock()
				return
			}
			np.stats.Failed++
			p.mu.Unlock()
			p.log.Warn("pool: start a sandbox ahead", "pool", name, "err", err)
			if !backoff.Wait(ctx) {
				return
			}
			continue
		}
		backoff.Reset()
		np.stats.Started++
		key, _ := runtime.PoolKey(spec)
		var drop []S
		if key != np.key {
			// Its specs changed (the caller's open makes another): what
			// was started from the old one serves none of them, nor
			// does this one the creates waiting.
			drop, np.ready = np.ready, nil
			np.key, np.stats.Template = key, spec.Template
			np.releaseWaiters(0)
		}
		switch {
		case ctx.Err() != nil || p.pools[name] != np:
			// Removed or closed while it started.
			drop = append(drop, s)
		case len(np.waiters) > 0:
			// A create waits for it: handed over at once.
			ch := np.waiters[0]
			np.waiters = np.waiters[1:]
			ch <- s
			np.stats.Hits++
			np.stats.Waited++
		case len(np.ready) >= np.size:
			// Shrunk while it started.
			drop = append(drop, s)
		default:
			np.ready = append(np.ready, s)
		}
		np.stats.Discarded += uint64(len(drop))
		if p.pools[name] != np {
			// Its figures were added up when it was removed.
			p.removed.Started++
			p.removed.Discarded += uint64(len(drop))
		}
		p.mu.Unlock()
		_ = destroyAll(drop)
	}
}

// retireLocked adds a removed pool's counts to the removed pools'.
func (p *Pools[S]) retireLocked(np *namedPool[S]) {
	r, st := &p.removed, np.stats
	r.Hits += st.Hits
	r.Misses += st.Misses
	r.Waited += st.Waited
	r.Started += st.Started
	r.Failed += st.Failed
	r.Discarded += st.Discarded
}

// startOne starts a sandbox of the spec open makes, in its turn.
func (p *Pools[S]) startOne(ctx context.Context, open func(context.Context) (runtime.Spec, func(), error)) (S, runtime.Spec, error) {
	var zero S
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return zero, runtime.Spec{}, ctx.Err()
	}
	defer func() { <-p.turn }()
	spec, release, err := open(ctx)
	if err != nil {
		return zero, spec, err
	}
	defer release()
	spec.ID = ""
	p.complete(&spec)
	if _, ok := runtime.PoolKey(spec); !ok {
		return zero, spec, errors.New("the spec cannot be pooled (a network, or unverified layers)")
	}
	s, err := p.start(ctx, spec)
	if err != nil {
		return zero, spec, fmt.Errorf("start a pooled sandbox: %w", err)
	}
	return s, spec, nil
}

// Take hands out a sandbox of the pool whose sandboxes spec (complete)
// would have made, counting a hit, or a miss when that pool has none
// ready; the pool starts the next. A create that finds none ready but one
// starting that no other create waits for waits for it (until ctx ends)
// rather than starting a second sandbox cold beside it: the one under way
// is nearer its end.
func (p *Pools[S]) Take(ctx context.Context, spec runtime.Spec) (S, bool) {
	var zero S
	key, ok := runtime.PoolKey(spec)
	if !ok {
		return zero, false
	}
	p.mu.Lock()
	var np *namedPool[S]
	for _, cand := range p.pools {
		if cand.key == key {
			np = cand
			break
		}
	}
	if np == nil {
		p.mu.Unlock()
		return zero, false
	}
	np.wake()
	if len(np.ready) > 0 {
		s := np.ready[0]
		np.ready = np.ready[1:]
		np.stats.Hits++
		p.mu.Unlock()
		return s, true
	}
	if np.starting <= len(np.waiters) {
		np.stats.Misses++
		p.mu.Unlock()
		return zero, false
	}
	ch := make(chan S, 1)
	np.waiters = append(np.waiters, ch)
	p.mu.Unlock()
	select {
	case s, ok := <-ch:
		return s, ok // the filler counted it
	case <-ctx.Done():
	}
	p.mu.Lock()
	if i := slices.Index(np.waiters, ch); i >= 0 {
		np.waiters = slices.Delete(np.waiters, i, i+1)
		np.stats.Misses++
		p.mu.Unlock()
		return zero, false
	}
	p.mu.Unlock()
	// Handed over (or let go) as the create gave up: it is not taken.
	if s, ok := <-ch; ok {
		p.mu.Lock()
		np.stats.Hits--
		np.stats.Waited--
		np.stats.Misses++
		np.stats.Discarded++
		p.mu.Unlock()
		_ = destroyAll([]S{s})
	}
	return zero, false
}

// Stats are the pools' figures (runtime.Pooler.PoolStats, without the
// backend's warm pool).
func (p *Pools[S]) Stats() runtime.PoolReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := runtime.PoolReport{Pools: make([]runtime.PoolStats, 0, len(p.pools)), Removed: p.removed}
	for _, np := range p.pools {
		st := np.stats
		st.Size, st.Ready, st.Starting = np.size, len(np.ready), np.starting
		out.Pools = append(out.Pools, st)
	}
	return out
}

// Close destroys every pool's sandboxes and waits for the starts under
// way, whose sandboxes are destroyed too.
func (p *Pools[S]) Close() error {
	p.mu.Lock()
	p.closed = true
	var drop []S
	for name, np := range p.pools {
		np.cancel()
		np.releaseWaiters(0)
		drop = append(drop, np.ready...)
		np.ready = nil
		delete(p.pools, name)
	}
	p.mu.Unlock()
	err := destroyAll(drop)
	p.wg.Wait()
	return err
}
