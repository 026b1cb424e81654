package persist

import (
	"context"
	"fmt"
	"time"
)

// deleteBlobIfUnused deletes the blob of key unless a snapshot still
// refers to it (snapshots may share a blob), or a template's layer chain
// does (a template saved from a sandbox on the built-in image holds the
// account's snapshot layers it started from: docs/TEMPLATES.md).
func (s *Service) deleteBlobIfUnused(ctx context.Context, key string) error {
	n, err := s.st.CountSnapshotsWithBlob(ctx, key)
	if err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if n, err = s.st.CountTemplatesWithBlob(ctx, key); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if err := s.opts.Blobs.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete blob %s: %w", key, err)
	}
	return nil
}

// collect deletes snapshots nothing refers to any more, passes after
// passes: deleting the top of a replaced chain unreferences the layer
// below it, and a chain left whole would count against its account's
// quota for as many captures as it is deep. It is best effort: what fails
// now is collected next time.
func (s *Service) collect(ctx context.Context) {
	for pass := 0; pass < 4*s.opts.MaxDepth+16; pass++ {
		if s.collectOnce(ctx) == 0 {
			return
		}
	}
}

// collectOnce deletes the snapshots unreferenced now, and says how many.
func (s *Service) collectOnce(ctx context.Context) int {
	snaps, err := s.st.ListUnreferencedSnapshots(ctx)
	if err != nil {
		s.log.Warn("list unreferenced snapshots", "err", err)
		return 0
	}
	deleted := 0
	for _, sn := range snaps {
		if s.opts.Now().Sub(sn.CreatedAt) < time.Minute {
			continue // may be about to be referenced by a run in flight
		}
		if err := s.st.DeleteSnapshot(ctx, sn.ID); err != nil {
			continue
		}
		deleted++
		if err := s.deleteBlobIfUnused(ctx, sn.BlobKey); err != nil {
			s.log.Warn("delete snapshot blob", "snapshot_id", sn.ID, "err", err)
		}
	}
	return deleted
}
