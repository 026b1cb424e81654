package host

// The end of a backend's sandbox that every backend shares: a stop
// recorded in its meta, a destroy that goes on past its failures, and the
// host cgroup that nothing of a stopped sandbox outlives.

import (
	"context"
	"os"
	"time"

	"github.com/sandboxd/sandboxd/internal/cgroup"
)

// Stopped ends a backend's Stop, which went on past its failures errs:
// the meta is marked stopped by mark and written while the sandbox's
// directory is there (not once it is destroyed), and the error is the
// stop's (nil when nothing failed).
func (a *Attachment[M]) Stopped(mark func(*M), errs []error) error {
	a.Mu.Lock()
	mark(&a.M)
	m, gone := a.M, a.Gone
	a.Mu.Unlock()
	if !gone {
		if _, err := os.Stat(a.Dir); err == nil {
			if err := WriteMeta(a.Dir, m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return Errors("stop sandbox", m.record().ID, errs)
}

// Destroy is a backend's runtime.Sandbox.Destroy of s, whose attachment
// is a, under the attachment's OpMu: stop (the backend's stop, the lock
// held), then each of the backend's teardown steps given the meta, each
// tried whatever the others did, then Destroyed.
func Destroy[S Served, M Recorded](ctx context.Context, b *Base[S], s S, a *Attachment[M], stop func(context.Context) error, steps ...func(M) error) error {
	a.OpMu.Lock()
	defer a.OpMu.Unlock()
	var errs []error
	if err := stop(ctx); err != nil {
		errs = append(errs, err)
	}
	m := a.Meta()
	for _, step := range steps {
		if err := step(m); err != nil {
			errs = append(errs, err)
		}
	}
	r := m.record()
	return b.Destroyed(s, a.Dir, r.ID, r.CID, errs)
}

// EndCgroup ends what still runs in the host cgroup at path and removes
// the group: processes of a sandbox its backend lost track of (a start
// cut short before it recorded them) end with it. Nothing when there is
// no such group.
func EndCgroup(path string) []error {
	g := cgroup.New(path)
	if !g.Exists() {
		return nil
	}
	var errs []error
	if err := g.Kill(5 * time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := RemoveCgroup(g); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// RemoveCgroup removes g, trying again for a second: the kernel may keep
// a group busy for a moment after its last process ended.
func RemoveCgroup(g cgroup.Group) error {
	var err error
	for range 50 {
		if err = g.Remove(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}
