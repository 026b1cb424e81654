package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

const apiKeyCols = "id, account_id, name, prefix, hash, sandbox_id, created_at, expires_at, revoked_at, last_used_at"

func scanAPIKey(s scanner) (APIKey, error) {
	var k APIKey
	var sandboxID sql.NullString
	var created int64
	var expires, revoked, lastUsed sql.NullInt64
	if err := s.Scan(&k.ID, &k.AccountID, &k.Name, &k.Prefix, &k.Hash, &sandboxID, &created, &expires, &revoked, &lastUsed); err != nil {
		return APIKey{}, err
	}
	k.SandboxID = sandboxID.String
	k.CreatedAt = fromMillis(created)
	k.ExpiresAt = fromNullMillis(expires)
	k.RevokedAt = fromNullMillis(revoked)
	k.LastUsedAt = fromNullMillis(lastUsed)
	return k, nil
}

// CreateAPIKey inserts k. It fills an empty ID with a random UUID and a zero
// CreatedAt with now; Hash is stored in lowercase and must not be empty. A
// hash that is already stored is ErrConflict; an unknown account or sandbox
// is ErrNotFound.
func (q *Queries) CreateAPIKey(ctx context.Context, k *APIKey) error {
	if k == nil {
		return fmt.Errorf("create api key: %w: nil key", ErrInvalid)
	}
	if k.Hash == "" {
		return fmt.Errorf("create api key: %w: empty hash", ErrInvalid)
	}
	k.Hash = strings.ToLower(k.Hash)
	if k.ID == "" {
		k.ID = uuid.NewString()
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = nowMS()
	}
	k.CreatedAt = ms(k.CreatedAt)
	k.ExpiresAt = msPtr(k.ExpiresAt)
	k.RevokedAt = msPtr(k.RevokedAt)
	k.LastUsedAt = msPtr(k.LastUsedAt)
	_, err := q.exec(ctx, "INSERT INTO api_keys ("+apiKeyCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		k.ID, k.AccountID, k.Name, k.Prefix, k.Hash, nullString(k.SandboxID), toMillis(k.CreatedAt),
		nullMillis(k.ExpiresAt), nullMillis(k.RevokedAt), nullMillis(k.LastUsedAt))
	if err != nil {
		return fmt.Errorf("create api key %s: %w", k.ID, mapErr(err))
	}
	return nil
}

// GetAPIKeyByHash returns the key whose hash is hashHex (any case), whether
// or not it is expired or revoked: callers judge that.
func (q *Queries) GetAPIKeyByHash(ctx context.Context, hashHex string) (APIKey, error) {
	k, err := scanAPIKey(q.queryRow(ctx, "SELECT "+apiKeyCols+" FROM api_keys WHERE hash = ?", strings.ToLower(hashHex)))
	if err != nil {
		return APIKey{}, fmt.Errorf("get api key by hash: %w", notFound(err))
	}
	return k, nil
}

// GetAPIKey returns the key with the given id.
func (q *Queries) GetAPIKey(ctx context.Context, id string) (APIKey, error) {
	k, err := scanAPIKey(q.queryRow(ctx, "SELECT "+apiKeyCols+" FROM api_keys WHERE id = ?", id))
	if err != nil {
		return APIKey{}, fmt.Errorf("get api key %s: %w", id, notFound(err))
	}
	return k, nil
}

// ListAPIKeys returns the keys of accountID, or of every account when
// accountID is empty, newest first.
func (q *Queries) ListAPIKeys(ctx context.Context, accountID string) ([]APIKey, error) {
	query := "SELECT " + apiKeyCols + " FROM api_keys"
	var args []any
	if accountID != "" {
		query += " WHERE account_id = ?"
		args = append(args, accountID)
	}
	out, err := queryAll(ctx, q, scanAPIKey, query+" ORDER BY created_at DESC, id DESC", args...)
	if err != nil {
		return nil, fmt.Errorf("list api keys of %q: %w", accountID, err)
	}
	return out, nil
}

// RevokeAPIKey marks the key revoked at the given time. Revoking a revoked
// key keeps the first revocation time and is not an error; an unknown id is
// ErrNotFound.
func (q *Queries) RevokeAPIKey(ctx context.Context, id string, at time.Time) error {
	n, err := q.execCount(ctx, "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", toMillis(ms(at)), id)
	if err != nil {
		return fmt.Errorf("revoke api key %s: %w", id, err)
	}
	if n == 0 {
		ok, err := q.exists(ctx, "api_keys", "id", id)
		if err != nil {
			return fmt.Errorf("revoke api key %s: %w", id, err)
		}
		if !ok {
			return fmt.Errorf("revoke api key %s: %w", id, ErrNotFound)
		}
	}
	return nil
}

// RevokeSandboxKeys revokes every unrevoked key minted for sandboxID.
func (q *Queries) RevokeSandboxKeys(ctx context.Context, sandboxID string, at time.Time) error {
	_, err := q.exec(ctx, "UPDATE api_keys SET revoked_at = ? WHERE sandbox_id = ? AND revoked_at IS NULL", toMillis(ms(at)), sandboxID)
	if err != nil {
		return fmt.Errorf("revoke keys of sandbox %s: %w", sandboxID, err)
	}
	return nil
}

// TouchAPIKey records that the key was used at the given time. It is one
// update by primary key and never moves last_used_at backwards; an unknown id
// is not an error. Every call is a write: on SQLite, callers on a hot path
// should not call it on every request.
func (q *Queries) TouchAPIKey(ctx context.Context, id string, at time.Time) error {
	v := toMillis(ms(at))
	_, err := q.exec(ctx, "UPDATE api_keys SET last_used_at = ? WHERE id = ? AND (last_used_at IS NULL OR last_used_at < ?)", v, id, v)
	if err != nil {
		return fmt.Errorf("touch api key %s: %w", id, err)
	}
	return nil
}
