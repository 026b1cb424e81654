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

// ChildSpec is what a fork makes of child from the sandbox whose record is
// parent: the parent's base, restored layers, limits and hostname (its
// memory was made with them), and the child's own id, environment, home
// socket, network and owner.
func ChildSpec(parent Record, child runtime.Spec) runtime.Spec {
	child.BaseDir, child.BaseImage, child.Limits, child.Hostname = parent.BaseDir, parent.BaseImage, parent.Limits, parent.Hostname
	child.Layers = nil
	return child
}

// Forking is a backend's part of a fork of one parent (ForkSaved).
type Forking[S Served] struct {
	// Save saves the parent for its children and lets it run on.
	Save func(ctx context.Context) error
	// Start makes one child of what Save saved.
	Start func(ctx context.Context, spec runtime.Spec) (S, error)
	// Done, when set, runs once the children are made or not: what Save
	// saved may go.
	Done func()
}

// ForkSaved is a backend's runtime.Forker.Fork of parent, whose
// attachment is p, under p's OpMu (its pause and destroy wait until the
// children are made from what is saved): the children's specs are
// checked against the parent's meta, plan says how to save it and make
// the children of what is saved, and the times taken are logged.
func ForkSaved[S Served, M Recorded](ctx context.Context, b *Base[S], p *Attachment[M], children []runtime.Spec, plan func(M) Forking[S]) ([]runtime.Sandbox, error) {
	p.OpMu.Lock()
	defer p.OpMu.Unlock()
	pm := p.Meta()
	parent := pm.record()
	if err := runtime.ForkSpecs(parent.Network != nil, children); err != nil {
		return nil, err
	}
	f := plan(pm)
	if f.Done != nil {
		defer f.Done()
	}
	start := time.Now()
	if err := f.Save(ctx); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", parent.ID, err)
	}
	saved := time.Since(start)
	kids, err := b.Fork(ctx, parent, children, f.Start)
	if err != nil {
		return nil, err
	}
	b.log.Info("sandbox forked", "id", parent.ID, "children", len(kids),
		"save", saved.Round(time.Millisecond), "elapsed", time.Since(start).Round(time.Millisecond))
	return kids, nil
}

// forkParallel is how many children are restored at once: a restore is
// mostly CPU (reading the saved memory in), and more at once than a small
// host's cores only makes each slower.
const forkParallel = 2

// Fork makes a runtime.Forker's children of the sandbox whose record is
// parent with start, given each child's ChildSpec, forkParallel at a time,
// all or none: when one fails, those made are destroyed and the errors
// are returned.
func (b *Base[S]) Fork(ctx context.Context, parent Record, children []runtime.Spec, start func(ctx context.Context, spec runtime.Spec) (S, error)) ([]runtime.Sandbox, error) {
	children = slices.Clone(children)
	for i := range children {
		children[i] = ChildSpec(parent, children[i])
		if err := b.Check(&children[i]); err != nil {
			return nil, fmt.Errorf("fork: %w", err)
		}
	}
	made := make([]runtime.Sandbox, len(children))
	errs := make([]error, len(children))
	slots := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i, spec := range children {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			if err := ctx.Err(); err != nil {
				errs[i] = err
				return
			}
			s, err := start(ctx, spec)
			if err != nil {
				errs[i] = fmt.Errorf("fork child %s: %w", spec.ID, err)
				return
			}
			made[i] = s
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range made {
			if s != nil {
				_ = s.Destroy(context.WithoutCancel(ctx))
			}
		}
		return nil, err
	}
	return made, nil
}
