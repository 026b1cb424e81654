package store

import (
	"context"
	"fmt"
	"time"
)

// lockUploadQuota is the namespace of the advisory lock that serialises
// the reservations of one account's uploads (see lock).
const lockUploadQuota = 0x5bd4

// UploadReservation asks room for an upload in flight: reservation ID of
// AccountID should hold Want bytes, and must hold at least Need, with all
// the account's live reservations together within Limit.
type UploadReservation struct {
	ID        string
	AccountID string
	Need      int64
	Want      int64
	Limit     int64
	// TTL is how long the reservation lives unless renewed: the rows of
	// a node that died lapse by themselves.
	TTL time.Duration
}

// UploadGrant is what ReserveUpload decided.
type UploadGrant struct {
	Bytes int64 // what the reservation holds now (unchanged when refused)
	// Others and OtherCount are the bytes and the number of the account's
	// other live reservations.
	Others     int64
	OtherCount int
}

// UploadQuotaError says that an upload's reservation did not fit: the
// account's other uploads in flight hold Others bytes of Limit, and the
// reservation needed Need.
type UploadQuotaError struct {
	Need, Others, Limit int64
	OtherCount          int
}

func (e *UploadQuotaError) Error() string {
	return fmt.Sprintf("%d other uploads in flight hold %d bytes of %d; %d more do not fit", e.OtherCount, e.Others, e.Limit, e.Need)
}

// Unwrap makes an UploadQuotaError match ErrQuota.
func (e *UploadQuotaError) Unwrap() error { return ErrQuota }

// ReserveUpload sets reservation r.ID (creating it) to as much of r.Want
// as fits under r.Limit beside the account's other live reservations,
// renewing it for r.TTL, when at least r.Need fits; otherwise it leaves it
// as it was and fails with an *UploadQuotaError (ErrQuota). The count and
// the write are one transaction under a per-account lock, so reservations
// made at once, on any node, never hold more than the limit together.
// Lapsed reservations of the account are deleted on the way.
func (q *Queries) ReserveUpload(ctx context.Context, r UploadReservation) (UploadGrant, error) {
	if r.ID == "" || r.AccountID == "" || r.Need < 0 || r.Want < r.Need || r.TTL <= 0 {
		return UploadGrant{}, fmt.Errorf("reserve upload: %w: %+v", ErrInvalid, r)
	}
	var g UploadGrant
	err := q.atomically(ctx, func(q *Queries) error {
		if err := q.lock(ctx, lockUploadQuota, r.AccountID); err != nil {
			return err
		}
		now := toMillis(nowMS())
		if _, err := q.exec(ctx, "DELETE FROM upload_reservations WHERE account_id = ? AND expires_at <= ?", r.AccountID, now); err != nil {
			return fmt.Errorf("delete lapsed upload reservations of %s: %w", r.AccountID, err)
		}
		err := q.queryRow(ctx, "SELECT COALESCE(SUM(bytes), 0), COUNT(*) FROM upload_reservations WHERE account_id = ? AND id <> ?",
			r.AccountID, r.ID).Scan(&g.Others, &g.OtherCount)
		if err != nil {
			return fmt.Errorf("sum upload reservations of %s: %w", r.AccountID, err)
		}
		room := r.Limit - g.Others
		if room < r.Need {
			return fmt.Errorf("reserve upload %s: %w", r.ID, &UploadQuotaError{Need: r.Need, Others: g.Others, Limit: r.Limit, OtherCount: g.OtherCount})
		}
		g.Bytes = min(r.Want, room)
		_, err = q.exec(ctx, `INSERT INTO upload_reservations (id, account_id, bytes, expires_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (id) DO UPDATE SET bytes = excluded.bytes, expires_at = excluded.expires_at`,
			r.ID, r.AccountID, g.Bytes, now+r.TTL.Milliseconds())
		if err != nil {
			return fmt.Errorf("reserve upload %s: %w", r.ID, mapErr(err))
		}
		return nil
	})
	return g, err
}

// RenewUpload keeps reservation id alive for ttl more; a reservation that
// lapsed or was released is not brought back (ErrNotFound).
func (q *Queries) RenewUpload(ctx context.Context, id string, ttl time.Duration) error {
	now := toMillis(nowMS())
	n, err := q.execCount(ctx, "UPDATE upload_reservations SET expires_at = ? WHERE id = ? AND expires_at > ?", now+ttl.Milliseconds(), id, now)
	if err != nil {
		return fmt.Errorf("renew upload reservation %s: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("renew upload reservation %s: %w", id, ErrNotFound)
	}
	return nil
}

// ReleaseUpload deletes reservation id; releasing one that is gone is not
// an error.
func (q *Queries) ReleaseUpload(ctx context.Context, id string) error {
	if _, err := q.exec(ctx, "DELETE FROM upload_reservations WHERE id = ?", id); err != nil {
		return fmt.Errorf("release upload reservation %s: %w", id, err)
	}
	return nil
}
