package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RepoVersion is the newest published state of an account's repository in
// a cluster (see package repo's Shared).
type RepoVersion struct {
	AccountID string    `json:"account_id"`
	Version   int64     `json:"version"` // 0: never published
	Present   bool      `json:"present"`
	Bundle    string    `json:"bundle,omitempty"` // blob key; "" without commits
	NodeID    string    `json:"node_id,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// lockRepo is the namespace of the advisory lock a repository's change
// holds (see lock).
const lockRepo = 0x5bd3

const repoVersionCols = "account_id, version, present, bundle, node_id, updated_at"

func scanRepoVersion(s scanner) (RepoVersion, error) {
	var v RepoVersion
	var at int64
	if err := s.Scan(&v.AccountID, &v.Version, &v.Present, &v.Bundle, &v.NodeID, &at); err != nil {
		return RepoVersion{}, err
	}
	v.UpdatedAt = fromMillis(at)
	return v, nil
}

// GetRepoVersion returns the published state of accountID's repository;
// ErrNotFound when none was ever published.
func (q *Queries) GetRepoVersion(ctx context.Context, accountID string) (RepoVersion, error) {
	v, err := scanRepoVersion(q.queryRow(ctx, "SELECT "+repoVersionCols+" FROM repo_versions WHERE account_id = ?", accountID))
	if err != nil {
		return RepoVersion{}, fmt.Errorf("get repository version of %s: %w", accountID, notFound(err))
	}
	return v, nil
}

// ChangeRepo runs fn holding accountID's repository lock (one change at a
// time over all the nodes of a cluster: a PostgreSQL advisory lock held
// until the transaction ends; SQLite's one writer) with the published
// state (Version 0 when none), and publishes the state fn returns, which
// must be the next version; nil publishes nothing. fn may take long (a git
// push): the transaction stays open meanwhile.
func (q *Queries) ChangeRepo(ctx context.Context, accountID string, fn func(cur RepoVersion) (*RepoVersion, error)) error {
	return q.atomically(ctx, func(q *Queries) error {
		if err := q.lock(ctx, lockRepo, accountID); err != nil {
			return err
		}
		cur, err := q.GetRepoVersion(ctx, accountID)
		if errors.Is(err, ErrNotFound) {
			cur, err = RepoVersion{AccountID: accountID}, nil
		}
		if err != nil {
			return err
		}
		next, err := fn(cur)
		if err != nil || next == nil {
			return err
		}
		if next.Version != cur.Version+1 {
			return fmt.Errorf("change repository of %s: %w: version %d after %d", accountID, ErrInvalid, next.Version, cur.Version)
		}
		next.AccountID, next.UpdatedAt = accountID, ms(nowMS())
		_, err = q.exec(ctx, `INSERT INTO repo_versions (`+repoVersionCols+`) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (account_id) DO UPDATE SET version = excluded.version, present = excluded.present,
				bundle = excluded.bundle, node_id = excluded.node_id, updated_at = excluded.updated_at`,
			accountID, next.Version, next.Present, next.Bundle, next.NodeID, toMillis(next.UpdatedAt))
		if err != nil {
			return fmt.Errorf("publish repository of %s: %w", accountID, mapErr(err))
		}
		return nil
	})
}

// CountReposWithBundle counts the repositories whose published state is
// the bundle key (bundles are content-addressed: two repositories may
// share one).
func (q *Queries) CountReposWithBundle(ctx context.Context, key string) (int, error) {
	var n int
	if err := q.queryRow(ctx, "SELECT COUNT(*) FROM repo_versions WHERE bundle = ?", key).Scan(&n); err != nil {
		return 0, fmt.Errorf("count repositories with bundle %s: %w", key, err)
	}
	return n, nil
}
