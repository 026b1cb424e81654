package store

import (
	"context"
	"fmt"
	"time"
)

// Volume is an account's named persistent disk (internal/volumes).
type Volume struct {
	ID        string
	AccountID string
	Name      string
	SizeBytes int64
	// GuestWritten: a microVM has had it read-write, so its image was
	// written by a guest kernel and no host kernel may mount it.
	GuestWritten bool
	// DataNode is the node whose local copy is the newest; "" when the
	// blob store's copy (BlobKey) is, or when it was never written.
	DataNode string
	// BlobKey is the blob store's copy of generation Generation; "" when
	// none was made.
	BlobKey    string
	Generation int64
	ForkedFrom string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// VolumeAttachment is a sandbox's use of a volume, in the order of the
// sandbox's mounts (Position): its lease on the volume.
type VolumeAttachment struct {
	SandboxID string
	VolumeID  string
	Position  int
	Path      string
	ReadOnly  bool
	CreatedAt time.Time
}

// VolumeBusyError says why a volume cannot be attached (or changed) now:
// the sandbox holding it, and how.
type VolumeBusyError struct {
	Volume    string // its name
	SandboxID string
	ReadOnly  bool // the holder's attachment is read-only
}

func (e *VolumeBusyError) Error() string {
	how := "read-write"
	if e.ReadOnly {
		how = "read-only"
	}
	return fmt.Sprintf("volume %q is attached %s to sandbox %s", e.Volume, how, e.SandboxID)
}

// Unwrap makes a VolumeBusyError match ErrConflict.
func (e *VolumeBusyError) Unwrap() error { return ErrConflict }

// lockVolume is the advisory lock namespace of a volume's attachments.
const lockVolume = 0x5bd3

const volumeCols = "id, account_id, name, size_bytes, guest_written, data_node, blob_key, generation, forked_from, created_at, updated_at"

func scanVolume(s scanner) (Volume, error) {
	var v Volume
	var created, updated int64
	if err := s.Scan(&v.ID, &v.AccountID, &v.Name, &v.SizeBytes, &v.GuestWritten, &v.DataNode, &v.BlobKey, &v.Generation, &v.ForkedFrom, &created, &updated); err != nil {
		return Volume{}, err
	}
	v.CreatedAt, v.UpdatedAt = fromMillis(created), fromMillis(updated)
	return v, nil
}

const attachmentCols = "sandbox_id, volume_id, position, path, read_only, created_at"

func scanAttachment(s scanner) (VolumeAttachment, error) {
	var a VolumeAttachment
	var created int64
	if err := s.Scan(&a.SandboxID, &a.VolumeID, &a.Position, &a.Path, &a.ReadOnly, &created); err != nil {
		return VolumeAttachment{}, err
	}
	a.CreatedAt = fromMillis(created)
	return a, nil
}

// VolumeLimits bound CreateVolumeWithin; 0 is unlimited.
type VolumeLimits struct {
	Count int   // volumes of the account
	Bytes int64 // their sizes summed
}

// CreateVolumeWithin inserts v if the account stays within lim: count and
// insert under the account's quota lock. A name the account has is
// ErrConflict; a limit passed wraps ErrQuota (*QuotaError, scope "volumes"
// or "volume bytes").
func (q *Queries) CreateVolumeWithin(ctx context.Context, v *Volume, lim VolumeLimits) error {
	if v == nil || v.ID == "" || v.AccountID == "" || v.Name == "" || v.SizeBytes <= 0 {
		return fmt.Errorf("create volume: %w: id, account, name and size are required", ErrInvalid)
	}
	now := nowMS()
	if v.CreatedAt.IsZero() {
		v.CreatedAt = now
	}
	v.CreatedAt = ms(v.CreatedAt)
	v.UpdatedAt = v.CreatedAt
	return q.atomically(ctx, func(q *Queries) error {
		if err := q.lock(ctx, lockAccountQuota, v.AccountID); err != nil {
			return err
		}
		if err := q.checkVolumeQuota(ctx, v.AccountID, "", 1, v.SizeBytes, lim); err != nil {
			return err
		}
		_, err := q.exec(ctx, "INSERT INTO volumes ("+volumeCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			v.ID, v.AccountID, v.Name, v.SizeBytes, v.GuestWritten, v.DataNode, v.BlobKey, v.Generation, v.ForkedFrom,
			toMillis(v.CreatedAt), toMillis(v.UpdatedAt))
		if err != nil {
			return fmt.Errorf("create volume %s: %w", v.Name, mapErr(err))
		}
		return nil
	})
}

// checkVolumeQuota checks that account, with addCount more volumes and
// addBytes more bytes (except volume except's size, when it is being
// resized), stays within lim.
func (q *Queries) checkVolumeQuota(ctx context.Context, account, except string, addCount int, addBytes int64, lim VolumeLimits) error {
	if lim.Count <= 0 && lim.Bytes <= 0 {
		return nil
	}
	var n int
	var total int64
	err := q.queryRow(ctx, "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM volumes WHERE account_id = ? AND id <> ?", account, except).Scan(&n, &total)
	if err != nil {
		return fmt.Errorf("count volumes of %s: %w", account, err)
	}
	if lim.Count > 0 && n+addCount > lim.Count {
		return fmt.Errorf("create volume: %w", &QuotaError{Scope: "volumes", Count: n, Limit: lim.Count})
	}
	if lim.Bytes > 0 && total+addBytes > lim.Bytes {
		return fmt.Errorf("size volume: %w", &QuotaError{Scope: "volume bytes", Count: int(total), Limit: int(lim.Bytes)})
	}
	return nil
}

// GetVolume returns the volume with id.
func (q *Queries) GetVolume(ctx context.Context, id string) (Volume, error) {
	v, err := scanVolume(q.queryRow(ctx, "SELECT "+volumeCols+" FROM volumes WHERE id = ?", id))
	if err != nil {
		return Volume{}, fmt.Errorf("get volume %s: %w", id, notFound(err))
	}
	return v, nil
}

// GetVolumeByName returns account's volume called name.
func (q *Queries) GetVolumeByName(ctx context.Context, account, name string) (Volume, error) {
	v, err := scanVolume(q.queryRow(ctx, "SELECT "+volumeCols+" FROM volumes WHERE account_id = ? AND name = ?", account, name))
	if err != nil {
		return Volume{}, fmt.Errorf("get volume %s: %w", name, notFound(err))
	}
	return v, nil
}

// ListVolumes returns account's volumes by name.
func (q *Queries) ListVolumes(ctx context.Context, account string) ([]Volume, error) {
	out, err := queryAll(ctx, q, scanVolume, "SELECT "+volumeCols+" FROM volumes WHERE account_id = ? ORDER BY name", account)
	if err != nil {
		return nil, fmt.Errorf("list volumes of %s: %w", account, err)
	}
	return out, nil
}

// ListVolumesOnNode returns the volumes whose newest copy is node's.
func (q *Queries) ListVolumesOnNode(ctx context.Context, node string) ([]Volume, error) {
	out, err := queryAll(ctx, q, scanVolume, "SELECT "+volumeCols+" FROM volumes WHERE data_node = ? ORDER BY id", node)
	if err != nil {
		return nil, fmt.Errorf("list volumes on %s: %w", node, err)
	}
	return out, nil
}

// VolumeAttachments returns the attachments of volume id.
func (q *Queries) VolumeAttachments(ctx context.Context, id string) ([]VolumeAttachment, error) {
	out, err := queryAll(ctx, q, scanAttachment, "SELECT "+attachmentCols+" FROM volume_attachments WHERE volume_id = ? ORDER BY created_at, sandbox_id", id)
	if err != nil {
		return nil, fmt.Errorf("list attachments of volume %s: %w", id, err)
	}
	return out, nil
}

// SandboxVolumes returns sandbox id's attachments in mount order.
func (q *Queries) SandboxVolumes(ctx context.Context, id string) ([]VolumeAttachment, error) {
	out, err := queryAll(ctx, q, scanAttachment, "SELECT "+attachmentCols+" FROM volume_attachments WHERE sandbox_id = ? ORDER BY position", id)
	if err != nil {
		return nil, fmt.Errorf("list volumes of sandbox %s: %w", id, err)
	}
	return out, nil
}

// attachVolumes records sandbox sb's attachments (sb.Volumes) in q's
// transaction: each volume is locked, then checked free for the mode
// asked (read-write: no attachment at all; read-only: no read-write one).
func (q *Queries) attachVolumes(ctx context.Context, sb *Sandbox) error {
	for i := range sb.Volumes {
		a := &sb.Volumes[i]
		a.SandboxID, a.Position = sb.ID, i
		a.CreatedAt = ms(sb.CreatedAt)
		if err := q.lock(ctx, lockVolume, a.VolumeID); err != nil {
			return err
		}
		held, err := q.VolumeAttachments(ctx, a.VolumeID)
		if err != nil {
			return err
		}
		for _, h := range held {
			if !a.ReadOnly || !h.ReadOnly {
				v, _ := q.GetVolume(ctx, a.VolumeID)
				return fmt.Errorf("attach volume: %w", &VolumeBusyError{Volume: v.Name, SandboxID: h.SandboxID, ReadOnly: h.ReadOnly})
			}
		}
		if _, err := q.exec(ctx, "INSERT INTO volume_attachments ("+attachmentCols+") VALUES (?, ?, ?, ?, ?, ?)",
			a.SandboxID, a.VolumeID, a.Position, a.Path, a.ReadOnly, toMillis(a.CreatedAt)); err != nil {
			return fmt.Errorf("attach volume %s to %s: %w", a.VolumeID, sb.ID, mapErr(err))
		}
	}
	return nil
}

// MarkVolumeGuestWritten records that a guest kernel is about to write
// volume id's image (a microVM attached it read-write).
func (q *Queries) MarkVolumeGuestWritten(ctx context.Context, id string) error {
	if _, err := q.exec(ctx, "UPDATE volumes SET guest_written = ? WHERE id = ?", true, id); err != nil {
		return fmt.Errorf("mark volume %s guest-written: %w", id, err)
	}
	return nil
}

// DetachVolume ends sandbox's lease on volume, once its node synced what
// the sandbox wrote (SyncedVolume). Detaching what is not attached is a
// no-op.
func (q *Queries) DetachVolume(ctx context.Context, sandbox, volume string) error {
	if _, err := q.exec(ctx, "DELETE FROM volume_attachments WHERE sandbox_id = ? AND volume_id = ?", sandbox, volume); err != nil {
		return fmt.Errorf("detach volume %s from %s: %w", volume, sandbox, err)
	}
	return nil
}

// VolumeData says where a volume's newest data is after a node wrote it:
// node's local copy (blobKey "": not synced), or the blob store's copy
// blobKey of generation (node ""). It answers the blob key the row had
// before, for the caller to collect when nothing names it any more.
func (q *Queries) VolumeData(ctx context.Context, id, node, blobKey string, generation int64) (previous string, err error) {
	err = q.atomically(ctx, func(q *Queries) error {
		v, err := q.GetVolume(ctx, id)
		if err != nil {
			return err
		}
		previous = v.BlobKey
		if blobKey == "" {
			blobKey = v.BlobKey
		}
		_, err = q.exec(ctx, "UPDATE volumes SET data_node = ?, blob_key = ?, generation = ?, updated_at = ? WHERE id = ?",
			node, blobKey, generation, toMillis(nowMS()), id)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("record volume %s data: %w", id, err)
	}
	return previous, nil
}

// ResizeVolume sets volume id's size (it only grows: the caller checks)
// within lim, refused while the volume is attached.
func (q *Queries) ResizeVolume(ctx context.Context, id string, size int64, lim VolumeLimits) (Volume, error) {
	var out Volume
	err := q.atomically(ctx, func(q *Queries) error {
		v, err := q.GetVolume(ctx, id)
		if err != nil {
			return err
		}
		if err := q.lock(ctx, lockAccountQuota, v.AccountID); err != nil {
			return err
		}
		if err := q.lock(ctx, lockVolume, id); err != nil {
			return err
		}
		if err := q.refuseAttached(ctx, v); err != nil {
			return err
		}
		if err := q.checkVolumeQuota(ctx, v.AccountID, id, 0, size, lim); err != nil {
			return err
		}
		v.SizeBytes, v.UpdatedAt = size, nowMS()
		if _, err := q.exec(ctx, "UPDATE volumes SET size_bytes = ?, updated_at = ? WHERE id = ?", size, toMillis(v.UpdatedAt), id); err != nil {
			return err
		}
		out = v
		return nil
	})
	if err != nil {
		return Volume{}, fmt.Errorf("resize volume %s: %w", id, err)
	}
	return out, nil
}

// refuseAttached is a *VolumeBusyError naming a holder of v, if any.
func (q *Queries) refuseAttached(ctx context.Context, v Volume) error {
	held, err := q.VolumeAttachments(ctx, v.ID)
	if err != nil {
		return err
	}
	if len(held) > 0 {
		return &VolumeBusyError{Volume: v.Name, SandboxID: held[0].SandboxID, ReadOnly: held[0].ReadOnly}
	}
	return nil
}

// DeleteVolume deletes volume id's row, refused while it is attached, and
// answers it as it was.
func (q *Queries) DeleteVolume(ctx context.Context, id string) (Volume, error) {
	var out Volume
	err := q.atomically(ctx, func(q *Queries) error {
		v, err := q.GetVolume(ctx, id)
		if err != nil {
			return err
		}
		if err := q.lock(ctx, lockVolume, id); err != nil {
			return err
		}
		if err := q.refuseAttached(ctx, v); err != nil {
			return err
		}
		if _, err := q.exec(ctx, "DELETE FROM volumes WHERE id = ?", id); err != nil {
			return err
		}
		out = v
		return nil
	})
	if err != nil {
		return Volume{}, fmt.Errorf("delete volume %s: %w", id, err)
	}
	return out, nil
}

// ForkVolume inserts fork (a copy of src's data made by the caller, or
// src's blob shared) within lim, refused while src is attached
// read-write: its data is changing.
func (q *Queries) ForkVolume(ctx context.Context, src string, fork *Volume, lim VolumeLimits) error {
	return q.atomically(ctx, func(q *Queries) error {
		v, err := q.GetVolume(ctx, src)
		if err != nil {
			return err
		}
		if err := q.lock(ctx, lockVolume, src); err != nil {
			return err
		}
		held, err := q.VolumeAttachments(ctx, src)
		if err != nil {
			return err
		}
		for _, h := range held {
			if !h.ReadOnly {
				return fmt.Errorf("fork volume: %w", &VolumeBusyError{Volume: v.Name, SandboxID: h.SandboxID})
			}
		}
		return q.CreateVolumeWithin(ctx, fork, lim)
	})
}

// CountVolumesWithBlob counts the volumes whose blob store copy is key.
func (q *Queries) CountVolumesWithBlob(ctx context.Context, key string) (int, error) {
	var n int
	if err := q.queryRow(ctx, "SELECT COUNT(*) FROM volumes WHERE blob_key = ?", key).Scan(&n); err != nil {
		return 0, fmt.Errorf("count volumes with blob %s: %w", key, err)
	}
	return n, nil
}

// ReleaseVolumesOfNode is what a node's death does to the volumes it held
// (membership, when it declares the node down): every attachment of a
// sandbox hosted there is dropped (not those of a sandbox paused with its
// files: its volumes' data went to the blob store with the pause), and a volume whose newest copy was
// there falls back to its blob store copy (what was written since is
// lost with the node). It answers the volumes that lost data.
func (q *Queries) ReleaseVolumesOfNode(ctx context.Context, node string) ([]Volume, error) {
	var lost []Volume
	err := q.atomically(ctx, func(q *Queries) error {
		if _, err := q.exec(ctx, "DELETE FROM volume_attachments WHERE sandbox_id IN (SELECT id FROM sandboxes WHERE node_id = ? AND NOT paused_files)", node); err != nil {
			return err
		}
		var err error
		if lost, err = q.ListVolumesOnNode(ctx, node); err != nil {
			return err
		}
		_, err = q.exec(ctx, "UPDATE volumes SET data_node = '', updated_at = ? WHERE data_node = ?", toMillis(nowMS()), node)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("release volumes of node %s: %w", node, err)
	}
	return lost, nil
}

// VolumeSandboxesOnNode answers the sandboxes holding volumes that are
// node's, or whose row is gone (their leases are anyone's to release).
func (q *Queries) VolumeSandboxesOnNode(ctx context.Context, node string) ([]string, error) {
	rows, err := q.query(ctx, "SELECT DISTINCT a.sandbox_id FROM volume_attachments a LEFT JOIN sandboxes s ON s.id = a.sandbox_id WHERE s.id IS NULL OR s.node_id = ? ORDER BY a.sandbox_id", node)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes with volumes on %s: %w", node, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
