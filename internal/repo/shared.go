package repo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Repositories shared by the nodes of a cluster. Each node keeps its own
// copies under its root; the newest state of every repository is published
// in Shared (the cluster's database and blob store) as a bundle of all its
// refs, with a version that counts the changes. Reads bring the local copy
// up to date first (a fetch from the newest bundle when the copy is
// older); every change (a push, a commit made here, creation, deletion)
// runs holding the repository's lock over all the nodes, on a copy brought
// up to date under that lock, and is published before it is acknowledged,
// so a push another node acknowledged is never lost with that node. A copy
// knows its version from the file sandboxd-version in the bare repository
// (git ignores it). Without Shared (one node) the repositories are this
// node's alone and none of this happens.

// Shared is where the nodes of a cluster publish their repositories.
type Shared interface {
	// Latest is the published state of account's repository (Version 0:
	// never published).
	Latest(ctx context.Context, account string) (SharedState, error)
	// Change runs fn holding account's lock over all the nodes, with the
	// published state, and publishes the state fn returns (nil: none).
	Change(ctx context.Context, account string, fn func(cur SharedState) (*SharedState, error)) error
	// PutBundle stores the bundle file at path and returns its key.
	PutBundle(ctx context.Context, path string) (string, error)
	// OpenBundle opens a bundle stored under key.
	OpenBundle(ctx context.Context, key string) (io.ReadCloser, error)
	// DropBundle deletes the bundle stored under key unless a published
	// state still names it.
	DropBundle(ctx context.Context, key string) error
}

// SharedState is a published state of a repository.
type SharedState struct {
	Version int64
	Present bool   // false: deleted
	Bundle  string // key of the bundle of its refs; "" for a repository without commits
}

// versionFile names, in a bare repository, the published version the copy
// holds.
const versionFile = "sandboxd-version"

// localVersion is the published version the copy at p holds (0: none, or
// no copy).
func localVersion(p string) int64 {
	b, err := os.ReadFile(filepath.Join(p, versionFile))
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

func setLocalVersion(p string, v int64) error {
	return os.WriteFile(filepath.Join(p, versionFile), []byte(strconv.FormatInt(v, 10)+"\n"), 0o640)
}

// sync brings the copy of account's repository up to its published
// state; a repository never published stays as this node has it.
func (m *Manager) sync(ctx context.Context, accountID string) error {
	if m.shared == nil {
		return nil
	}
	id, err := CanonicalID(accountID)
	if err != nil {
		return err
	}
	p, err := m.Path(id)
	if err != nil {
		return err
	}
	cur, err := m.shared.Latest(ctx, id)
	if err != nil {
		return fmt.Errorf("repository of %s: latest state: %w", id, err)
	}
	if cur.Version == 0 || localVersion(p) == cur.Version {
		return nil
	}
	l := m.lock(p + "\x00sync")
	l.Lock()
	defer l.Unlock()
	return m.apply(ctx, id, p, cur)
}

// apply makes the copy at p the published state st (callers hold the
// copy's sync lock, or the repository's lock over the nodes).
func (m *Manager) apply(ctx context.Context, id, p string, st SharedState) error {
	if localVersion(p) == st.Version {
		return nil
	}
	if !st.Present {
		if err := m.removeLocal(ctx, id, p); err != nil {
			return err
		}
		return nil
	}
	if ok, err := isRepo(p); err != nil {
		return err
	} else if !ok {
		if err := m.initRepo(ctx, id, p); err != nil {
			return err
		}
	}
	if st.Bundle == "" {
		// Published without commits: no refs.
		out, err := m.run(ctx, p, nil, "for-each-ref", "--format=%(refname)")
		if err != nil {
			return err
		}
		for _, ref := range strings.Fields(string(out)) {
			if _, err := m.run(ctx, p, nil, "update-ref", "-d", ref); err != nil {
				return err
			}
		}
	} else if err := m.fetchBundle(ctx, p, st.Bundle); err != nil {
		return fmt.Errorf("repository of %s: fetch version %d: %w", id, st.Version, err)
	}
	return setLocalVersion(p, st.Version)
}

// fetchBundle makes the refs of the copy at p those of the bundle key.
func (m *Manager) fetchBundle(ctx context.Context, p, key string) error {
	rc, err := m.shared.OpenBundle(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.CreateTemp(m.root, ".bundle-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := io.Copy(f, rc); err != nil {
		return fmt.Errorf("download bundle %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = m.run(ctx, p, nil, "fetch", "--quiet", "--prune", "--force", "--no-write-fetch-head", f.Name(), "+refs/*:refs/*")
	return err
}

// changingKey marks, in a change's context, the repository it changes.
type changingKey struct{ id string }

// changing says ctx is inside a change of repository id.
func changing(ctx context.Context, id string) bool {
	v, _ := ctx.Value(changingKey{id}).(bool)
	return v
}

// errUnchanged, returned by a change's fn, says it changed nothing:
// nothing is published.
var errUnchanged = errors.New("repository unchanged")

// change runs fn, which changes account's repository at p, as the one
// change of it over all the nodes, on a copy brought up to date first, and
// publishes the result before it returns. Without Shared it runs fn.
func (m *Manager) change(ctx context.Context, accountID string, fn func(ctx context.Context, p string) error) error {
	id, err := CanonicalID(accountID)
	if err != nil {
		return err
	}
	p, err := m.Path(id)
	if err != nil {
		return err
	}
	if m.shared == nil || changing(ctx, id) {
		// Alone, or inside a change of this very repository (a submodule
		// into itself): that change publishes it.
		if err := fn(ctx, p); !errors.Is(err, errUnchanged) {
			return err
		}
		return nil
	}
	ctx = context.WithValue(ctx, changingKey{id}, true)
	var (
		published int64
		old, next string
	)
	err = m.shared.Change(ctx, id, func(cur SharedState) (*SharedState, error) {
		l := m.lock(p + "\x00sync")
		l.Lock()
		defer l.Unlock()
		if cur.Version > 0 {
			if err := m.apply(ctx, id, p, cur); err != nil {
				return nil, err
			}
		}
		if err := fn(ctx, p); errors.Is(err, errUnchanged) {
			published = cur.Version
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		st, err := m.bundle(ctx, p)
		if err != nil {
			return nil, err
		}
		st.Version = cur.Version + 1
		published, old, next = st.Version, cur.Bundle, st.Bundle
		return &st, nil
	})
	if errors.Is(err, errUnchanged) {
		return nil
	}
	if err != nil {
		// Whatever fn did to the copy was not published: the next read
		// or change takes the published state again.
		if ok, _ := isRepo(p); ok {
			_ = setLocalVersion(p, 0)
		}
		return err
	}
	if ok, _ := isRepo(p); ok && published > 0 {
		if err := setLocalVersion(p, published); err != nil {
			return err
		}
	}
	if old != "" && old != next {
		if err := m.shared.DropBundle(ctx, old); err != nil {
			m.log.WarnContext(ctx, "drop an old repository bundle", "account", id, "err", err)
		}
	}
	return nil
}

// bundle is the state of the copy at p to publish: whether it exists, and
// a bundle of its refs (stored) when it has any.
func (m *Manager) bundle(ctx context.Context, p string) (SharedState, error) {
	ok, err := isRepo(p)
	if err != nil || !ok {
		return SharedState{Present: false}, err
	}
	out, err := m.run(ctx, p, nil, "for-each-ref", "--count=1", "--format=%(refname)")
	if err != nil {
		return SharedState{}, err
	}
	if strings.TrimSpace(string(out)) == "" {
		return SharedState{Present: true}, nil
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	file := filepath.Join(m.root, ".bundle-"+hex.EncodeToString(rnd[:]))
	defer os.Remove(file)
	if _, err := m.run(ctx, p, nil, "bundle", "create", "--quiet", file, "--all"); err != nil {
		return SharedState{}, err
	}
	key, err := m.shared.PutBundle(ctx, file)
	if err != nil {
		return SharedState{}, fmt.Errorf("store bundle: %w", err)
	}
	return SharedState{Present: true, Bundle: key}, nil
}

// removeLocal deletes the copy at p (the repository was deleted).
func (m *Manager) removeLocal(ctx context.Context, id, p string) error {
	if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	trash := filepath.Join(m.root, ".delete-"+filepath.Base(p)+"-"+hex.EncodeToString(rnd[:]))
	if err := os.Rename(p, trash); err != nil {
		return fmt.Errorf("delete repository of %s: %w", id, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("delete repository of %s: %w", id, err)
	}
	return nil
}
