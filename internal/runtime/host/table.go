package host

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Table is what a backend serves: its state directory and the sandboxes
// this process has attached, by container id. Safe for concurrent use.
type Table[S comparable] struct {
	Dir Dir

	mu    sync.Mutex
	byCID map[string]S
}

// NewTable returns an empty table over the state directory dir.
func NewTable[S comparable](dir string) *Table[S] {
	return &Table[S]{Dir: Dir(dir), byCID: map[string]S{}}
}

// Put records s as the attached sandbox cid.
func (t *Table[S]) Put(cid string, s S) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byCID[cid] = s
}

// Remove forgets the sandbox cid if it is still s.
func (t *Table[S]) Remove(cid string, s S) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byCID[cid] == s {
		delete(t.byCID, cid)
	}
}

// All returns the attached sandboxes.
func (t *Table[S]) All() []S {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]S, 0, len(t.byCID))
	for _, s := range t.byCID {
		out = append(out, s)
	}
	return out
}

// Get is the attached sandbox that id claims (runtime.Runtime.Get): an
// error wrapping runtime.ErrNotFound when there is none.
func (t *Table[S]) Get(id string) (S, error) {
	var zero S
	if !ValidID(id) {
		return zero, fmt.Errorf("get sandbox %q: %w", id, runtime.ErrNotFound)
	}
	cid, err := t.Dir.CID(id)
	if err != nil {
		return zero, err
	}
	t.mu.Lock()
	s, ok := t.byCID[cid]
	t.mu.Unlock()
	if !ok {
		return zero, fmt.Errorf("get sandbox %s: %w", id, runtime.ErrNotFound)
	}
	return s, nil
}

// List is runtime.Runtime.List: the ids claimed on this host.
func (t *Table[S]) List() ([]string, error) { return t.Dir.List() }

// Meta is what Reattach reads of a backend's meta.json.
type Meta interface {
	// SandboxID is the id the sandbox was created for ("" for one never
	// assigned one, such as a template builder).
	SandboxID() string
}

// Backend is what Reattach needs of a backend, over its meta type M.
type Backend[M Meta] struct {
	// Blank is the meta of a sandbox cid whose own could not be read:
	// enough to destroy it.
	Blank func(cid string) M
	// Destroy removes a leftover sandbox.
	Destroy func(ctx context.Context, dir string, m M) error
	// Serve attaches a sandbox its id still claims.
	Serve func(ctx context.Context, dir string, m M)
}

// Reattach finds the sandboxes an earlier process left: those an id still
// claims are served again, the others (half-made, never or no longer
// claimed, unreadable) are destroyed.
func Reattach[M Meta](ctx context.Context, dir Dir, log *slog.Logger, b Backend[M]) error {
	found, err := dir.Scan()
	if err != nil {
		return err
	}
	for _, f := range found {
		m, err := ReadMeta[M](f.Dir)
		if err != nil {
			m = b.Blank(f.CID)
		}
		if id := m.SandboxID(); err != nil || id == "" || f.ClaimedBy != id {
			log.Info("removing leftover sandbox", "cid", f.CID, "err", err)
			if derr := b.Destroy(ctx, f.Dir, m); derr != nil {
				log.Warn("remove leftover sandbox", "cid", f.CID, "err", derr)
			}
			continue
		}
		b.Serve(ctx, f.Dir, m)
	}
	return nil
}
