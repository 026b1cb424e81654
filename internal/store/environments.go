package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

const environmentCols = "account_id, snapshot_id, github_repo, expires_at, created_at, updated_at"

func scanEnvironment(s scanner) (Environment, error) {
	var e Environment
	var snapshotID, repo sql.NullString
	var expires, created, updated int64
	if err := s.Scan(&e.AccountID, &snapshotID, &repo, &expires, &created, &updated); err != nil {
		return Environment{}, err
	}
	if snapshotID.Valid {
		e.SnapshotID = &snapshotID.String
	}
	if repo.Valid {
		e.GithubRepo = &repo.String
	}
	e.ExpiresAt = fromMillis(expires)
	e.CreatedAt = fromMillis(created)
	e.UpdatedAt = fromMillis(updated)
	return e, nil
}

// nullStringPtr stores a nil pointer as NULL.
func nullStringPtr(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// GetEnvironment returns the environment of accountID; ErrNotFound when it
// has none.
func (q *Queries) GetEnvironment(ctx context.Context, accountID string) (Environment, error) {
	e, err := scanEnvironment(q.queryRow(ctx, "SELECT "+environmentCols+" FROM environments WHERE account_id = ?", accountID))
	if err != nil {
		return Environment{}, fmt.Errorf("get environment of %s: %w", accountID, notFound(err))
	}
	return e, nil
}

// UpsertEnvironment creates the environment of e.AccountID or replaces its
// snapshot, repository, expiry and update time, keeping its creation time. A
// zero CreatedAt or UpdatedAt is now. On return e holds the stored row. An
// unknown account or snapshot is ErrNotFound.
func (q *Queries) UpsertEnvironment(ctx context.Context, e *Environment) error {
	if e == nil {
		return fmt.Errorf("upsert environment: %w: nil environment", ErrInvalid)
	}
	t := nowMS()
	if e.CreatedAt.IsZero() {
		e.CreatedAt = t
	}
	if e.UpdatedAt.IsZero() {
		e.UpdatedAt = t
	}
	e.CreatedAt, e.UpdatedAt, e.ExpiresAt = ms(e.CreatedAt), ms(e.UpdatedAt), ms(e.ExpiresAt)
	stored, err := scanEnvironment(q.writeQueryRow(ctx, `INSERT INTO environments (`+environmentCols+`)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (account_id) DO UPDATE SET snapshot_id = excluded.snapshot_id,
			github_repo = excluded.github_repo, expires_at = excluded.expires_at, updated_at = excluded.updated_at
		RETURNING `+environmentCols,
		e.AccountID, nullStringPtr(e.SnapshotID), nullStringPtr(e.GithubRepo),
		toMillis(e.ExpiresAt), toMillis(e.CreatedAt), toMillis(e.UpdatedAt)))
	if err != nil {
		return fmt.Errorf("upsert environment of %s: %w", e.AccountID, mapErr(err))
	}
	*e = stored
	return nil
}

// DeleteEnvironment deletes the environment of accountID and returns it;
// ErrNotFound when it has none.
func (q *Queries) DeleteEnvironment(ctx context.Context, accountID string) (Environment, error) {
	e, err := scanEnvironment(q.writeQueryRow(ctx, "DELETE FROM environments WHERE account_id = ? RETURNING "+environmentCols, accountID))
	if err != nil {
		return Environment{}, fmt.Errorf("delete environment of %s: %w", accountID, notFound(mapDeleteErr(err)))
	}
	return e, nil
}

// RecentEnvironments returns up to limit environments whose snapshot is
// still current at now, the most recently changed first: the accounts a
// node starts sandboxes ahead for after it restarts.
func (q *Queries) RecentEnvironments(ctx context.Context, limit int, now time.Time) ([]Environment, error) {
	if limit <= 0 {
		return nil, nil
	}
	out, err := queryAll(ctx, q, scanEnvironment,
		"SELECT "+environmentCols+" FROM environments WHERE snapshot_id IS NOT NULL AND expires_at > ? ORDER BY updated_at DESC, account_id LIMIT ?",
		toMillis(ms(now)), limit)
	if err != nil {
		return nil, fmt.Errorf("list recent environments: %w", err)
	}
	return out, nil
}
