package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// ErrQuota is returned when an insert would take an account or a node past
// its limit. The error wraps a *QuotaError that says which and by how much.
var ErrQuota = errors.New("over quota")

// QuotaError says which limit an insert would have broken.
type QuotaError struct {
	Scope string // "account", "node" or "runs"
	Count int    // how many there are now
	Limit int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%s has %d, the limit is %d", e.Scope, e.Count, e.Limit)
}

// Unwrap makes a QuotaError match ErrQuota.
func (e *QuotaError) Unwrap() error { return ErrQuota }

// Namespaces of the PostgreSQL advisory locks the quota checks take (the
// two-key form: distinct from River's one-key locks).
const (
	lockAccountQuota = 0x5bd1
	lockNodeQuota    = 0x5bd2
)

// lock serialises, until the end of q's transaction, every quota check on
// key in namespace. On SQLite the transaction already holds the database's
// only write lock (it began IMMEDIATE), so there is nothing more to take.
func (q *Queries) lock(ctx context.Context, namespace int, key string) error {
	if q.tx == nil {
		return errors.New("quota lock outside a transaction")
	}
	if q.dialect != DialectPostgres {
		return nil
	}
	// hashtext collisions only make two keys share a lock: safe, if slower.
	if _, err := q.exec(ctx, "SELECT pg_advisory_xact_lock(?, hashtext(?))", namespace, key); err != nil {
		return fmt.Errorf("lock quota of %s: %w", key, err)
	}
	return nil
}

// SandboxLimits bound CreateSandboxWithin; 0 is unlimited.
type SandboxLimits struct {
	PerAccount int // active sandboxes of the sandbox's account
	PerNode    int // active sandboxes on the sandbox's node
}

// CreateSandboxWithin inserts sb (as CreateSandbox does) only if the
// account and the node stay within lim, counting active (pending, running
// and stopping) sandboxes. Count and insert are one transaction under a
// per-account and a per-node lock, so simultaneous calls cannot all see
// room: of N concurrent calls exactly the room left succeed, the rest get
// an error wrapping ErrQuota.
func (q *Queries) CreateSandboxWithin(ctx context.Context, sb *Sandbox, lim SandboxLimits) error {
	if sb == nil {
		return fmt.Errorf("create sandbox: %w: nil sandbox", ErrInvalid)
	}
	return q.CreateSandboxesWithin(ctx, []*Sandbox{sb}, lim)
}

// CreateSandboxesWithin inserts sbs, all of one account on one node (a
// fork's children), as CreateSandboxWithin does one: all of them if they
// all fit within lim, none otherwise.
func (q *Queries) CreateSandboxesWithin(ctx context.Context, sbs []*Sandbox, lim SandboxLimits) error {
	if len(sbs) == 0 || slices.Contains(sbs, nil) {
		return fmt.Errorf("create sandboxes: %w: none or nil", ErrInvalid)
	}
	account, node := sbs[0].AccountID, sbs[0].NodeID
	for _, sb := range sbs {
		if sb.AccountID != account || sb.NodeID != node {
			return fmt.Errorf("create sandboxes: %w: of more than one account or node", ErrInvalid)
		}
	}
	return q.atomically(ctx, func(q *Queries) error {
		// Always account before node, so two creates never wait on each
		// other's locks in opposite orders.
		if lim.PerAccount > 0 {
			if err := q.lock(ctx, lockAccountQuota, account); err != nil {
				return err
			}
			n, err := q.CountActiveSandboxes(ctx, account)
			if err != nil {
				return err
			}
			if n+len(sbs) > lim.PerAccount {
				return fmt.Errorf("create sandbox: %w", &QuotaError{Scope: "account", Count: n, Limit: lim.PerAccount})
			}
		}
		if lim.PerNode > 0 {
			if err := q.lock(ctx, lockNodeQuota, node); err != nil {
				return err
			}
			n, err := q.countActiveOnNode(ctx, node)
			if err != nil {
				return err
			}
			if n+len(sbs) > lim.PerNode {
				return fmt.Errorf("create sandbox: %w", &QuotaError{Scope: "node", Count: n, Limit: lim.PerNode})
			}
		}
		for _, sb := range sbs {
			if err := q.CreateSandbox(ctx, sb); err != nil {
				return err
			}
		}
		return nil
	})
}

func (q *Queries) countActiveOnNode(ctx context.Context, nodeID string) (int, error) {
	in, args := inList(activeSandboxStatuses)
	var n int
	err := q.queryRow(ctx, "SELECT COUNT(*) FROM sandboxes WHERE node_id = ? AND status IN ("+in+")",
		append([]any{nodeID}, args...)...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count active sandboxes on node %s: %w", nodeID, err)
	}
	return n, nil
}

// CountPendingRuns counts the queued and executing runs of task (of every
// task when empty) of accountID.
func (q *Queries) CountPendingRuns(ctx context.Context, accountID, task string) (int, error) {
	query := "SELECT COUNT(*) FROM runs WHERE account_id = ? AND status IN (?, ?)"
	args := []any{accountID, RunQueued, RunExecuting}
	if task != "" {
		query += " AND task = ?"
		args = append(args, task)
	}
	var n int
	if err := q.queryRow(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count pending %s runs of %s: %w", task, accountID, err)
	}
	return n, nil
}

// CreateRunWithin inserts r (as CreateRun does) only if its account has
// fewer than limit queued or executing runs of r's task (0: unlimited).
// Count and insert are atomic as in CreateSandboxWithin; inside a caller's
// transaction (InTx) they share it, so the run's job can be enqueued in the
// same transaction.
func (q *Queries) CreateRunWithin(ctx context.Context, r *Run, limit int) error {
	if r == nil {
		return fmt.Errorf("create run: %w: nil run", ErrInvalid)
	}
	return q.atomically(ctx, func(q *Queries) error {
		if limit > 0 {
			if err := q.lock(ctx, lockAccountQuota, r.AccountID); err != nil {
				return err
			}
			n, err := q.CountPendingRuns(ctx, r.AccountID, r.Task)
			if err != nil {
				return err
			}
			if n >= limit {
				return fmt.Errorf("create run: %w", &QuotaError{Scope: "runs", Count: n, Limit: limit})
			}
		}
		return q.CreateRun(ctx, r)
	})
}
