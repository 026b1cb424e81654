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
type Prewarmed[S Served] struct {
	budget int
	start  func(ctx context.Context, spec runtime.Spec) (S, error)
	now    func() time.Time

	mu      sync.Mutex
	owners  map[string]*prewarmEntry[S]
	gen     uint64
	closed  bool
	pending sync.WaitGroup
}

// prewarmEntry is an owner's prewarmed sandbox, or the one starting.
type prewarmEntry[S Served] struct {
	key   string
	gen   uint64 // which Prewarm made it; a later one supersedes it
	s     S
	ready bool
	used  time.Time
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
	p.gen++
	mine := &prewarmEntry[S]{key: key, gen: p.gen, used: p.now()}
	var drop []S
	if old, ok := p.owners[spec.Owner]; ok && old.ready {
		drop = append(drop, old.s)
	}
	p.owners[spec.Owner] = mine
	drop = append(drop, p.evictLocked(spec.Owner)...)
	p.pending.Add(1)
	p.mu.Unlock()
	defer p.pending.Done()
	destroyAll(drop)

	spec.ID = ""
	s, err := p.start(ctx, spec)
	p.mu.Lock()
	superseded := p.closed || p.owners[spec.Owner] != mine
	if err != nil || superseded {
		if p.owners[spec.Owner] == mine {
			delete(p.owners, spec.Owner)
		}
		p.mu.Unlock()
		if err != nil {
			return fmt.Errorf("prewarm a sandbox for %s: %w", spec.Owner, err)
		}
		destroyAll([]S{s})
		return nil
	}
	mine.s, mine.ready = s, true
	p.mu.Unlock()
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
		if e := p.owners[oldest]; e.ready {
			drop = append(drop, e.s)
		}
		delete(p.owners, oldest)
	}
	return drop
}

// Take hands out the owner's prewarmed sandbox when spec (complete) would
// have made it, removing it from the set. A ready sandbox that no longer
// matches (the owner's snapshot moved on) is destroyed: nothing will ask
// for it again.
func (p *Prewarmed[S]) Take(spec runtime.Spec) (S, bool) {
	var zero S
	key, ok := runtime.PrewarmKey(spec)
	if !ok {
		return zero, false
	}
	p.mu.Lock()
	e, found := p.owners[spec.Owner]
	if !found || !e.ready {
		p.mu.Unlock()
		return zero, false
	}
	delete(p.owners, spec.Owner)
	p.mu.Unlock()
	if e.key != key {
		destroyAll([]S{e.s})
		return zero, false
	}
	return e.s, true
}

// Drop implements runtime.Prewarmer.DropPrewarmed.
func (p *Prewarmed[S]) Drop(ctx context.Context, owner string) error {
	p.mu.Lock()
	e, ok := p.owners[owner]
	delete(p.owners, owner)
	p.mu.Unlock()
	if ok && e.ready {
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
// which destroy what they start.
func (p *Prewarmed[S]) Close() error {
	p.mu.Lock()
	p.closed = true
	var drop []S
	for owner, e := range p.owners {
		if e.ready {
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
