package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Prewarmed is the sandboxes a backend started ahead for their owners
// (runtime.Prewarmer): for each owner, up to the number its last Prewarm
// asked for, all of one spec (the one its last Prewarm named), and at most
// budget in all: the least recently prewarmed owners' go first to make
// room. The backend starts them (start, with no id claimed) and turns a
// taken one into the new sandbox.
//
// A create that finds none of its owner's ready but one still starting
// waits for it rather than starting a second one cold beside it: on a busy
// host the two would share the CPUs, and the one under way is nearer its
// end.
type Prewarmed[S Served] struct {
	budget int
	start  func(ctx context.Context, spec runtime.Spec) (S, error)
	now    func() time.Time

	mu      sync.Mutex
	owners  map[string]*prewarmSet[S]
	kept    int // entries of every set
	closed  bool
	pending sync.WaitGroup
	stats   runtime.PrewarmStats // counts; Kept is kept
}

// prewarmSet is an owner's sandboxes, ready or starting, of one spec.
type prewarmSet[S Served] struct {
	key     string
	used    time.Time
	want    int
	entries []*prewarmEntry[S]
}

// prewarmEntry is one prewarmed sandbox, or one starting.
type prewarmEntry[S Served] struct {
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
	return &Prewarmed[S]{budget: budget, start: start, now: time.Now, owners: map[string]*prewarmSet[S]{}}
}

// ErrNotPrewarmable is Prewarm's error for a spec no prewarmed sandbox could
// serve (see runtime.PrewarmKey).
var ErrNotPrewarmable = errors.New("spec cannot be prewarmed (no owner, a network, or unverified layers)")

// Prewarm implements runtime.Prewarmer.Prewarm; spec is complete (limits
// and hostname filled in).
func (p *Prewarmed[S]) Prewarm(ctx context.Context, spec runtime.Spec, want int) (bool, error) {
	key, ok := runtime.PrewarmKey(spec)
	if !ok {
		return false, ErrNotPrewarmable
	}
	want = min(max(want, 1), p.budget)
	if want <= 0 {
		return false, nil
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false, errors.New("prewarm: runtime closed")
	}
	set, ok := p.owners[spec.Owner]
	var drop []S
	if !ok || set.key != key {
		// Another spec's (an older snapshot's): its ready sandboxes go;
		// those starting find themselves superseded and go then.
		if ok {
			drop = p.removeLocked(spec.Owner, set)
		}
		set = &prewarmSet[S]{key: key}
		p.owners[spec.Owner] = set
	}
	set.used, set.want = p.now(), want
	// Fewer wanted than kept: the ready ones beyond go.
	for i := len(set.entries) - 1; i >= 0 && len(set.entries) > want; i-- {
		if e := set.entries[i]; e.ready() {
			drop = append(drop, e.s)
			set.entries = slices.Delete(set.entries, i, i+1)
			p.kept--
		}
	}
	if len(set.entries) >= want {
		p.stats.Discarded += uint64(len(drop))
		p.mu.Unlock()
		return false, destroyAll(drop)
	}
	mine := &prewarmEntry[S]{done: make(chan struct{})}
	set.entries = append(set.entries, mine)
	p.kept++
	drop = append(drop, p.evictLocked(spec.Owner)...)
	p.stats.Discarded += uint64(len(drop))
	p.pending.Add(1)
	p.mu.Unlock()
	defer p.pending.Done()
	_ = destroyAll(drop)

	spec.ID = ""
	s, err := p.start(ctx, spec)
	p.mu.Lock()
	mine.s, mine.err = s, err
	close(mine.done)
	current := p.owners[spec.Owner] == set && slices.Contains(set.entries, mine)
	if err != nil {
		p.stats.Failed++
	} else {
		p.stats.Started++
	}
	switch {
	case mine.taken:
		// The Take waiting for it has it now, or destroys it.
	case err != nil:
		if current {
			set.remove(mine)
			p.kept--
		}
	case p.closed || !current:
		// Superseded while it started: nothing will ask for it.
		p.stats.Discarded++
		p.mu.Unlock()
		return true, destroyAll([]S{s})
	}
	p.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("prewarm a sandbox for %s: %w", spec.Owner, err)
	}
	return true, nil
}

func (s *prewarmSet[S]) remove(e *prewarmEntry[S]) {
	if i := slices.Index(s.entries, e); i >= 0 {
		s.entries = slices.Delete(s.entries, i, i+1)
	}
}

// removeLocked forgets owner's set and returns its ready sandboxes to
// destroy (one still starting is destroyed by its Prewarm, which finds
// itself superseded).
func (p *Prewarmed[S]) removeLocked(owner string, set *prewarmSet[S]) []S {
	var drop []S
	for _, e := range set.entries {
		if e.ready() {
			drop = append(drop, e.s)
		}
	}
	p.kept -= len(set.entries)
	delete(p.owners, owner)
	return drop
}

// evictLocked removes the least recently prewarmed owners' sets (never
// keep's) until the budget holds, and returns their ready sandboxes to
// destroy.
func (p *Prewarmed[S]) evictLocked(keep string) []S {
	var drop []S
	for p.kept > p.budget {
		oldest := ""
		for owner, set := range p.owners {
			if owner != keep && (oldest == "" || set.used.Before(p.owners[oldest].used)) {
				oldest = owner
			}
		}
		if oldest == "" {
			break
		}
		drop = append(drop, p.removeLocked(oldest, p.owners[oldest])...)
	}
	return drop
}

// Take hands out one of the owner's prewarmed sandboxes when spec
// (complete) would have made it, removing it from the set: a ready one, or
// else one still starting, waited for (until ctx ends). Ready sandboxes
// that no longer match (the owner's snapshot moved on) are destroyed:
// nothing will ask for them again.
func (p *Prewarmed[S]) Take(ctx context.Context, spec runtime.Spec) (S, bool) {
	var zero S
	key, ok := runtime.PrewarmKey(spec)
	if !ok {
		return zero, false
	}
	p.mu.Lock()
	set, found := p.owners[spec.Owner]
	if !found {
		p.mu.Unlock()
		return zero, false
	}
	if set.key != key {
		// Stale ones go; those starting for another snapshot may be the
		// newer ones (this create began before that snapshot): they stay.
		var drop []S
		for i := len(set.entries) - 1; i >= 0; i-- {
			if e := set.entries[i]; isDone(e) {
				if e.err == nil {
					drop = append(drop, e.s)
				}
				set.entries = slices.Delete(set.entries, i, i+1)
				p.kept--
			}
		}
		if len(set.entries) == 0 {
			delete(p.owners, spec.Owner)
		}
		p.stats.Discarded += uint64(len(drop))
		p.mu.Unlock()
		_ = destroyAll(drop)
		return zero, false
	}
	var e *prewarmEntry[S]
	if i := slices.IndexFunc(set.entries, (*prewarmEntry[S]).ready); i >= 0 {
		e = set.entries[i]
	} else if i := slices.IndexFunc(set.entries, func(e *prewarmEntry[S]) bool { return !isDone(e) && !e.taken }); i >= 0 {
		e = set.entries[i]
	}
	if e == nil {
		p.mu.Unlock()
		return zero, false
	}
	set.remove(e)
	p.kept--
	if e.ready() {
		p.stats.Taken++
		p.mu.Unlock()
		return e.s, true
	}
	e.taken = true
	p.mu.Unlock()

	select {
	case <-e.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		if e.err != nil {
			return zero, false
		}
		p.stats.Taken++
		p.stats.Waited++
		return e.s, true
	case <-ctx.Done():
	}
	p.mu.Lock()
	select {
	case <-e.done:
		// It ended as we gave up: it is ours to destroy.
		if e.err == nil {
			p.stats.Discarded++
		}
		p.mu.Unlock()
		if e.err == nil {
			_ = destroyAll([]S{e.s})
		}
	default:
		// Its Prewarm finds it neither taken nor current: it destroys it
		// (and counts it).
		e.taken = false
		p.mu.Unlock()
	}
	return zero, false
}

// isDone says whether e's start ended, either way.
func isDone[S Served](e *prewarmEntry[S]) bool {
	select {
	case <-e.done:
		return true
	default:
		return false
	}
}

// Drop implements runtime.Prewarmer.DropPrewarmed.
func (p *Prewarmed[S]) Drop(ctx context.Context, owner string) error {
	p.mu.Lock()
	var drop []S
	if set, ok := p.owners[owner]; ok {
		drop = p.removeLocked(owner, set)
	}
	p.stats.Discarded += uint64(len(drop))
	p.mu.Unlock()
	var errs []error
	for _, s := range drop {
		errs = append(errs, s.Destroy(context.WithoutCancel(ctx)))
	}
	return errors.Join(errs...)
}

// Len is how many sandboxes are kept or starting.
func (p *Prewarmed[S]) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kept
}

// Stats implements runtime.Prewarmer.PrewarmStats.
func (p *Prewarmed[S]) Stats() runtime.PrewarmStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Kept = p.kept
	return st
}

// Close destroys every kept sandbox and waits for the Prewarms under way,
// which destroy what they start (or hand it to a Take already waiting).
func (p *Prewarmed[S]) Close() error {
	p.mu.Lock()
	p.closed = true
	var drop []S
	for owner, set := range p.owners {
		drop = append(drop, p.removeLocked(owner, set)...)
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
