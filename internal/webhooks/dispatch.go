package webhooks

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// How the dispatcher works.
const (
	// dispatchEvery is how often pending deliveries are looked for: the
	// most an event waits before its first attempt is queued.
	dispatchEvery = 250 * time.Millisecond
	// dispatchBatch bounds the deliveries one look queues.
	dispatchBatch = 100
	// sweepEvery is how often events older than KeepEvents are deleted.
	sweepEvery = time.Hour
)

// Run dispatches pending deliveries to River until ctx ends: each look
// claims a batch and enqueues their jobs in one transaction (a claim
// never loses its job, nor is a delivery queued twice, whichever node
// looks), and sweeps old events hourly.
func (s *Service) Run(ctx context.Context) error {
	if s.cfg.Jobs == nil {
		return errors.New("webhooks: no job queue to deliver with")
	}
	tick := time.NewTicker(dispatchEvery)
	defer tick.Stop()
	lastSweep := time.Time{}
	for {
		for {
			n, err := s.Dispatch(ctx)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("webhooks: dispatch deliveries", "err", err)
			}
			if err != nil || n < dispatchBatch {
				break
			}
		}
		if s.cfg.KeepEvents > 0 && time.Since(lastSweep) >= sweepEvery {
			lastSweep = time.Now()
			if n, err := s.st.DeleteEventsBefore(ctx, s.cfg.Now().Add(-s.cfg.KeepEvents)); err != nil {
				s.log.Warn("webhooks: sweep old events", "err", err)
			} else if n > 0 {
				s.log.Info("webhooks: old events deleted", "count", n)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Dispatch queues one batch of pending deliveries and reports how many.
func (s *Service) Dispatch(ctx context.Context) (int, error) {
	var n int
	err := s.st.InTx(ctx, func(tx *sql.Tx, q *store.Queries) error {
		ids, err := q.ClaimPendingDeliveries(ctx, dispatchBatch)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if err := s.cfg.Jobs.InsertTx(ctx, tx, jobs.DeliverWebhookArgs{DeliveryID: id}, ""); err != nil {
				return err
			}
		}
		n = len(ids)
		return nil
	})
	return n, err
}
