package store

import (
	"context"
	"fmt"
	"time"
)

// Counts for /metrics, read at each scrape. Each is one grouped query over
// an index range as large as what is live (or recent), never a scan of
// every row the retention keeps.

// SandboxCount is how many of a node's live sandboxes are in one state.
type SandboxCount struct {
	Status  SandboxStatus // pending, running or stopping
	Pause   string        // "", or a running sandbox's pause state
	Runtime string
	N       int64
}

// CountLiveSandboxes counts nodeID's pending, running (paused ones
// included, by pause state) and stopping sandboxes by status, pause and
// runtime.
func (q *Queries) CountLiveSandboxes(ctx context.Context, nodeID string) ([]SandboxCount, error) {
	out, err := queryAll(ctx, q, func(r scanner) (SandboxCount, error) {
		var c SandboxCount
		return c, r.Scan(&c.Status, &c.Pause, &c.Runtime, &c.N)
	}, `SELECT status, pause, runtime, COUNT(*) FROM sandboxes
		WHERE node_id = ? AND status IN (?, ?, ?) GROUP BY status, pause, runtime`,
		nodeID, SandboxPending, SandboxRunning, SandboxStopping)
	if err != nil {
		return nil, fmt.Errorf("count the live sandboxes of node %s: %w", nodeID, err)
	}
	return out, nil
}

// RunCount is how many runs are in one status.
type RunCount struct {
	Status RunStatus
	N      int64
}

// CountRuns counts the runs queued or executing now, and those that
// finished at or after since, by status, over every node.
func (q *Queries) CountRuns(ctx context.Context, since time.Time) ([]RunCount, error) {
	out, err := queryAll(ctx, q, func(r scanner) (RunCount, error) {
		var c RunCount
		return c, r.Scan(&c.Status, &c.N)
	}, `SELECT status, COUNT(*) FROM runs WHERE status IN (?, ?) OR finished_at >= ? GROUP BY status`,
		RunQueued, RunExecuting, toMillis(ms(since)))
	if err != nil {
		return nil, fmt.Errorf("count runs: %w", err)
	}
	return out, nil
}
