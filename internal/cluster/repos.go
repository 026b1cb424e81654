package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Repos is where the nodes of a cluster publish the accounts' repositories
// (repo.Shared): each one's newest state in the database (repo_versions,
// changed under a PostgreSQL advisory lock per repository) and its bundle
// in the blob store beside the snapshots. Any node serves any account's
// repository from its copy, brought up to date from there; a push or a
// commit is published before it is acknowledged, so none is lost with the
// node that took it.
type Repos struct {
	st    *store.Store
	blobs blob.Store
	node  string
}

var _ repo.Shared = (*Repos)(nil)

// NewRepos returns node's view of the cluster's repositories.
func NewRepos(st *store.Store, blobs blob.Store, node string) *Repos {
	return &Repos{st: st, blobs: blobs, node: node}
}

// Latest implements repo.Shared.
func (r *Repos) Latest(ctx context.Context, account string) (repo.SharedState, error) {
	v, err := r.st.GetRepoVersion(ctx, account)
	if errors.Is(err, store.ErrNotFound) {
		return repo.SharedState{}, nil
	}
	if err != nil {
		return repo.SharedState{}, err
	}
	return repo.SharedState{Version: v.Version, Present: v.Present, Bundle: v.Bundle}, nil
}

// Change implements repo.Shared.
func (r *Repos) Change(ctx context.Context, account string, fn func(cur repo.SharedState) (*repo.SharedState, error)) error {
	return r.st.ChangeRepo(ctx, account, func(cur store.RepoVersion) (*store.RepoVersion, error) {
		next, err := fn(repo.SharedState{Version: cur.Version, Present: cur.Present, Bundle: cur.Bundle})
		if err != nil || next == nil {
			return nil, err
		}
		return &store.RepoVersion{Version: next.Version, Present: next.Present, Bundle: next.Bundle, NodeID: r.node}, nil
	})
}

// PutBundle implements repo.Shared.
func (r *Repos) PutBundle(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	info, err := r.blobs.Put(ctx, f)
	if err != nil {
		return "", fmt.Errorf("store repository bundle: %w", err)
	}
	return info.Key, nil
}

// OpenBundle implements repo.Shared.
func (r *Repos) OpenBundle(ctx context.Context, key string) (io.ReadCloser, error) {
	return r.blobs.Get(ctx, key)
}

// DropBundle implements repo.Shared. Bundles are content-addressed, so two
// repositories (or a repository and a snapshot, were their bytes ever the
// same) may share one: it goes only when no published state names it.
func (r *Repos) DropBundle(ctx context.Context, key string) error {
	n, err := r.st.CountReposWithBundle(ctx, key)
	if err != nil || n > 0 {
		return err
	}
	if n, err := r.st.CountSnapshotsWithBlob(ctx, key); err != nil || n > 0 {
		return err
	}
	return r.blobs.Delete(ctx, key)
}
