package host

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Prewarmed is the sandboxes a backend started ahead for their owners
// (runtime.Prewarmer): at most one per owner, the one its last Prewarm
// asked for, and at most budget in all, the least recently prewarmed
// owner's destroyed first to make room. The backend starts them (start,
// with no id claimed) and turns a taken one into the new sandbox.
//
// A create that finds its owner's sandbox still starting waits for it
// rather than starting a second one cold beside it: on a busy host the
// two would share the CPUs, and the one under way is nearer its end.
type Prewarmed[S Served] struct {
	budget int
	start  func(ctx context.Context, spec runtime.Spec) (S, error)
	now    func() time.Time

	mu      sync.Mutex
	owners  map[string]*prewarmEntry[S]
	closed  bool
	pending sync.WaitGroup
}

// prewarmEntry is an owner's prewarmed sandbox, or the one starting.
type prewarmEntry[S Served] struct {
	key  string
	used time.Time
	// done is closed when the start ended; s and err are its outcome.
	done chan struct{}
	s    S
	err  error
	// taken says a Take claimed it while it started: its Prewarm hands
	// the sandbox over instead of keeping or destroying it.
	taken bool
}

func (e *prewarmEntry[S]) ready() bool {
	select {
	case <-e.done:
		return e.err == nil
	default:
		return false
	}
}

// NewPrewarmed keeps up to budget sandboxes that start makes.
func NewPrewarmed[S Served](budget int, start func(ctx context.Context, spec runtime.Spec) (S, error)) *Prewarmed[S] {
	return &Prewarmed[S]{budget: budget, start: start, now: time.Now, owners: map[string]*prewarmEntry[S]{}}
}

// ErrNotPrewarmable is Prewarm's error for a spec no prewarmed sandbox could
// serve (see runtime.PrewarmKey).
var ErrNotPrewarmable = errors.New("spec cannot be prewarmed (no owner, a network, or unverified layers)")

// Prewarm implements runtime.Prewarmer.Prewarm; spec is complete (limits
// and hostname filled in).
func (p *Prewarmed[S]) Prewarm(ctx context.Context, spec runtime.Spec) error {
	key, ok := runtime.PrewarmKey(spec)
	if !ok {
		return ErrNotPrewarmable
	}
	if p.budget <= 0 {
		return nil
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return errors.New("prewarm: runtime closed")
	}
	if e, ok := p.owners[spec.Owner]; ok && e.key == key {
		e.used = p.now()
		p.mu.Unlock()
		return nil
	}
	mine := &prewarmEntry[S]{key: key, used: p.now(), done: make(chan struct{})}
	var drop []S
	if old, ok := p.owners[spec.Owner]; ok && old.ready() {
		drop = append(drop, old.s)
	}
	p.owners[spec.Owner] = mine
	drop = append(drop, p.evictLocked(spec.Owner)...)
	p.pending.Add(1)
	p.mu.Unlock()
	defer p.pending.Done()
	_ = destroyAll(drop)

	spec.ID = ""
	s, err := p.start(ctx, spec)
	p.mu.Lock()
	mine.s, mine.err = s, err
	close(mine.done)
	current := p.owners[spec.Owner] == mine
	switch {
	case mine.taken:
		// The Take waiting for it has it now, or destroys it.
	case err != nil:
		if current {
			delete(p.owners, spec.Owner)
		}
	case p.closed || !current:
		// Superseded while it started: nothing will ask for it.
		p.mu.Unlock()
		return destroyAll([]S{s})
	}
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("prewarm a sandbox for %s: %w", spec.Owner, err)
	}
	return nil
}

// evictLocked removes the least recently prewarmed owners (never keep)
// until the budget holds, and returns their ready sandboxes to destroy
// (one still starting is destroyed by its Prewarm, which finds itself
// superseded).
func (p *Prewarmed[S]) evictLocked(keep string) []S {
	var drop []S
	for len(p.owners) > p.budget {
		oldest := ""
		for owner, e := range p.owners {
			if owner != keep && (oldest == "" || e.used.Before(p.owners[oldest].used)) {
				oldest = owner
			}
		}
		if oldest == "" {
			break
		}
		if e := p.owners[oldest]; e.ready() {
			drop = append(drop, e.s)
		}
		delete(p.owners, oldest)
	}
	return drop
}

// Take hands out the owner's prewarmed sandbox when spec (complete) would
// have made it, removing it from the set; one still starting is waited for
// (until ctx ends). A ready sandbox that no longer matches (the owner's
// snapshot moved on) is destroyed: nothing will ask for it again.
func (p *Prewarmed[S]) Take(ctx context.Context, spec runtime.Spec) (S, bool) {
	var zero S
	key, ok := runtime.PrewarmKey(spec)
	if !ok {
		return zero, false
	}
	p.mu.Lock()
	e, found := p.owners[spec.Owner]
	if !found {
		p.mu.Unlock()
		return zero, false
	}
	ready := e.ready()
	if e.key != key {
		// A stale one goes; one starting for another snapshot may be the
		// newer one (this create began before that snapshot): keep it.
		if ready {
			delete(p.owners, spec.Owner)
			p.mu.Unlock()
			_ = destroyAll([]S{e.s})
			return zero, false
		}
		p.mu.Unlock()
		return zero, false
	}
	delete(p.owners, spec.Owner)
	if ready {
		p.mu.Unlock()
		return e.s, true
	}
	e.taken = true
	p.mu.Unlock()

	select {
	case <-e.done:
		return e.s, e.err == nil
	case <-ctx.Done():
	}
	p.mu.Lock()
	select {
	case <-e.done:
		// It ended as we gave up: it is ours to destroy.
		p.mu.Unlock()
		if e.err == nil {
			_ = destroyAll([]S{e.s})
		}
	default:
		// Its Prewarm finds it neither taken nor current: it destroys it.
		e.taken = false
		p.mu.Unlock()
	}
	return zero, false
}

// Drop implements runtime.Prewarmer.DropPrewarmed.
func (p *Prewarmed[S]) Drop(ctx context.Context, owner string) error {
	p.mu.Lock()
	e, ok := p.owners[owner]
	delete(p.owners, owner)
	p.mu.Unlock()
	if ok && e.ready() {
		return e.s.Destroy(context.WithoutCancel(ctx))
	}
	return nil
}

// Len is how many sandboxes are kept or starting.
func (p *Prewarmed[S]) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owners)
}

// Close destroys every kept sandbox and waits for the Prewarms under way,
// which destroy what they start (or hand it to a Take already waiting).
func (p *Prewarmed[S]) Close() error {
	p.mu.Lock()
	p.closed = true
	var drop []S
	for owner, e := range p.owners {
		if e.ready() {
			drop = append(drop, e.s)
		}
		delete(p.owners, owner)
	}
	p.mu.Unlock()
	err := destroyAll(drop)
	p.pending.Wait()
	return err
}

func destroyAll[S Served](ss []S) error {
	var errs []error
	for _, s := range ss {
		errs = append(errs, s.Destroy(context.Background()))
	}
	return errors.Join(errs...)
}
