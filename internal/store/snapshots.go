package store

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/google/uuid"
)

const snapshotCols = "id, account_id, parent_id, base_image, blob_key, size, depth, sandbox_id, created_at"

func scanSnapshot(s scanner) (Snapshot, error) {
	var sn Snapshot
	var parentID, sandboxID sql.NullString
	var created int64
	if err := s.Scan(&sn.ID, &sn.AccountID, &parentID, &sn.BaseImage, &sn.BlobKey, &sn.Size, &sn.Depth, &sandboxID, &created); err != nil {
		return Snapshot{}, err
	}
	sn.ParentID = parentID.String
	sn.SandboxID = sandboxID.String
	sn.CreatedAt = fromMillis(created)
	return sn, nil
}

// CreateSnapshot inserts sn. It fills an empty ID with a random UUID and a
// zero CreatedAt with now. An unknown account or parent is ErrNotFound.
func (q *Queries) CreateSnapshot(ctx context.Context, sn *Snapshot) error {
	if sn == nil {
		return fmt.Errorf("create snapshot: %w: nil snapshot", ErrInvalid)
	}
	if sn.ID == "" {
		sn.ID = uuid.NewString()
	}
	if sn.CreatedAt.IsZero() {
		sn.CreatedAt = nowMS()
	}
	sn.CreatedAt = ms(sn.CreatedAt)
	_, err := q.exec(ctx, "INSERT INTO snapshots ("+snapshotCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
		sn.ID, sn.AccountID, nullString(sn.ParentID), sn.BaseImage, sn.BlobKey, sn.Size, sn.Depth,
		nullString(sn.SandboxID), toMillis(sn.CreatedAt))
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", sn.ID, mapErr(err))
	}
	return nil
}

// GetSnapshot returns the snapshot with the given id.
func (q *Queries) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	sn, err := scanSnapshot(q.queryRow(ctx, "SELECT "+snapshotCols+" FROM snapshots WHERE id = ?", id))
	if err != nil {
		return Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, notFound(err))
	}
	return sn, nil
}

// ListSnapshots returns the snapshots of accountID, newest first.
func (q *Queries) ListSnapshots(ctx context.Context, accountID string) ([]Snapshot, error) {
	out, err := queryAll(ctx, q, scanSnapshot, "SELECT "+snapshotCols+" FROM snapshots WHERE account_id = ? ORDER BY created_at DESC, id DESC", accountID)
	if err != nil {
		return nil, fmt.Errorf("list snapshots of %s: %w", accountID, err)
	}
	return out, nil
}

// DeleteSnapshot deletes the snapshot row with the given id (not its blob).
// A snapshot that is still an environment's or another snapshot's parent is
// ErrConflict; an unknown id is ErrNotFound.
func (q *Queries) DeleteSnapshot(ctx context.Context, id string) error {
	n, err := q.execCount(ctx, "DELETE FROM snapshots WHERE id = ?", id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, mapDeleteErr(err))
	}
	if n == 0 {
		return fmt.Errorf("delete snapshot %s: %w", id, ErrNotFound)
	}
	return nil
}

// DeleteSnapshotsOf deletes every snapshot row of accountID, first clearing
// the account's environment's reference to them, and returns the rows it
// deleted so that their blobs can be removed. It runs in one transaction.
func (q *Queries) DeleteSnapshotsOf(ctx context.Context, accountID string) ([]Snapshot, error) {
	var deleted []Snapshot
	err := q.atomically(ctx, func(q *Queries) error {
		var err error
		deleted, err = queryAll(ctx, q, scanSnapshot, "SELECT "+snapshotCols+" FROM snapshots WHERE account_id = ? ORDER BY created_at DESC, id DESC", accountID)
		if err != nil {
			return err
		}
		if len(deleted) == 0 {
			return nil
		}
		if _, err := q.exec(ctx, `UPDATE environments SET snapshot_id = NULL
			WHERE snapshot_id IN (SELECT id FROM snapshots WHERE account_id = ?)`, accountID); err != nil {
			return err
		}
		if _, err := q.exec(ctx, "DELETE FROM snapshots WHERE account_id = ?", accountID); err != nil {
			return mapDeleteErr(err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delete snapshots of %s: %w", accountID, err)
	}
	return deleted, nil
}

// ListUnreferencedSnapshots returns the snapshots that are neither an
// environment's snapshot, nor another snapshot's parent, nor the starting
// point of an active sandboxes (whose next snapshot will name it as parent),
// oldest first: the candidates for garbage collection. DeleteSnapshot
// refuses any that became an environment's or a parent since.
func (q *Queries) ListUnreferencedSnapshots(ctx context.Context) ([]Snapshot, error) {
	out, err := queryAll(ctx, q, scanSnapshot, `SELECT `+prefixCols("s", snapshotCols)+` FROM snapshots s
		WHERE NOT EXISTS (SELECT 1 FROM environments e WHERE e.snapshot_id = s.id)
		AND NOT EXISTS (SELECT 1 FROM snapshots c WHERE c.parent_id = s.id)
		AND NOT EXISTS (SELECT 1 FROM sandboxes b WHERE b.snapshot_id = s.id
			AND b.status IN ('pending', 'running', 'stopping'))
		ORDER BY s.created_at, s.id`)
	if err != nil {
		return nil, fmt.Errorf("list unreferenced snapshots: %w", err)
	}
	return out, nil
}

// CountSnapshotsWithBlob returns how many snapshot rows name blobKey. Blobs
// are content-addressed, so two snapshots (even of different accounts) may
// share one; a blob may be deleted only when this is zero.
func (q *Queries) CountSnapshotsWithBlob(ctx context.Context, blobKey string) (int, error) {
	var n int
	if err := q.queryRow(ctx, "SELECT COUNT(*) FROM snapshots WHERE blob_key = ?", blobKey).Scan(&n); err != nil {
		return 0, fmt.Errorf("count snapshots of blob %s: %w", blobKey, err)
	}
	return n, nil
}
