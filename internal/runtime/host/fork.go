package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

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
