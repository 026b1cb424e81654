package store

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Deleting ended work (package retention sweeps with these). A sweep goes
// through the ended rows oldest first, one batch at a time: each call
// selects at most limit rows past from and deletes those of them that the
// DELETE itself still finds ended, so that nodes sweeping at the same time
// delete each row once and never one that is not (or no longer) ended,
// and a sweep cut short loses nothing but time. It returns how many went
// and where the next batch begins (the zero Cursor once it looked at the
// last row): a row kept because another still needs it is passed over,
// not looked at again and again.

// DeleteEndedSandboxes looks at the next batch (oldest first, past from)
// of at most limit sandboxes that stopped or failed at or before before,
// and deletes those no other row needs with what the schema cascades to
// (the keys minted for them, their E2B records). A sandbox that a queued or executing run still names
// is kept (its worker reads the row), as is one another row still refers
// to without a cascade. Pending, running (paused ones included) and
// stopping sandboxes are never touched.
func (q *Queries) DeleteEndedSandboxes(ctx context.Context, before time.Time, from Cursor, limit int) (int, Cursor, error) {
	// sandboxes.id rather than an alias: the same condition serves the
	// DELETE, whose target SQLite does not let us alias.
	cond := `status IN (?, ?) AND stopped_at <= ?
		AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.sandbox_id = sandboxes.id AND r.status IN (?, ?))`
	args := []any{SandboxStopped, SandboxFailed, toMillis(ms(before)), RunQueued, RunExecuting}
	n, next, err := q.sweep(ctx, "sandboxes", "stopped_at", cond, args, from, limit)
	if err != nil {
		return n, Cursor{}, fmt.Errorf("delete sandboxes ended before %v: %w", before, err)
	}
	return n, next, nil
}

// DeleteRunsFinishedBefore looks at the next batch (oldest first, past
// from) of at most limit runs that finished at or before before, and
// deletes those no other row needs.
// Queued and executing runs are never touched. Their logs are files on the
// node that ran them (package runs), which that node's sweep removes once
// their rows are gone (MissingRuns).
func (q *Queries) DeleteRunsFinishedBefore(ctx context.Context, before time.Time, from Cursor, limit int) (int, Cursor, error) {
	fin, args := inList(finalRunStatusList())
	n, next, err := q.sweep(ctx, "runs", "finished_at", "status IN ("+fin+") AND finished_at <= ?",
		append(args, toMillis(ms(before))), from, limit)
	if err != nil {
		return n, Cursor{}, fmt.Errorf("delete runs finished before %v: %w", before, err)
	}
	return n, next, nil
}

// sweep is one batch of a sweep over table: at most limit rows matching
// cond (with args) past from, ordered by the time column at and then id,
// deleted when they still match.
func (q *Queries) sweep(ctx context.Context, table, at, cond string, args []any, from Cursor, limit int) (int, Cursor, error) {
	past, pastArgs := from.newer(at, "id")
	selectArgs := append(append(slices.Clip(args), pastArgs...), limit)
	batch, err := queryAll(ctx, q, func(s scanner) (Cursor, error) {
		var c Cursor
		var t int64
		err := s.Scan(&c.ID, &t)
		c.CreatedAt = fromMillis(t)
		return c, err
	}, "SELECT id, "+at+" FROM "+table+" WHERE "+cond+" AND "+past+" ORDER BY "+at+", id LIMIT ?", selectArgs...)
	if err != nil {
		return 0, Cursor{}, fmt.Errorf("select: %w", err)
	}
	ids := make([]string, len(batch))
	for i, c := range batch {
		ids[i] = c.ID
	}
	n, err := q.deleteBatch(ctx, table, ids, cond, args...)
	if err != nil || len(batch) < limit {
		return n, Cursor{}, err
	}
	return n, batch[len(batch)-1], nil
}

// MissingRuns returns those of ids that name no run (in no particular
// order): what is left on disk of runs whose rows went.
func (q *Queries) MissingRuns(ctx context.Context, ids []string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	in, args := inList(ids)
	found, err := queryAll(ctx, q, scanID, "SELECT id FROM runs WHERE id IN ("+in+")", args...)
	if err != nil {
		return nil, fmt.Errorf("look up %d runs: %w", len(ids), err)
	}
	have := make(map[string]bool, len(found))
	for _, id := range found {
		have[id] = true
	}
	var missing []string
	for _, id := range ids {
		if !have[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// deleteBatch deletes the rows of table whose id is one of ids and that
// still match cond (with its args), and says how many went. When a row of
// the batch is still referenced by another without a cascade (the whole
// statement fails then), the rows are deleted one by one and those still
// referenced are left: the schema, not this code, decides what must stay.
func (q *Queries) deleteBatch(ctx context.Context, table string, ids []string, cond string, args ...any) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	in, idArgs := inList(ids)
	n, err := q.execCount(ctx, "DELETE FROM "+table+" WHERE id IN ("+in+") AND "+cond, append(idArgs, args...)...)
	if err == nil {
		return int(n), nil
	}
	if classify(err) != foreignKeyViolation || q.tx != nil {
		// In a transaction PostgreSQL refuses every statement after a
		// failed one: only a caller outside one gets the fallback.
		return 0, mapDeleteErr(err)
	}
	deleted := 0
	for _, id := range ids {
		n, err := q.execCount(ctx, "DELETE FROM "+table+" WHERE id = ? AND "+cond, append([]any{id}, args...)...)
		switch {
		case classify(err) == foreignKeyViolation:
			continue // still referenced
		case err != nil:
			return deleted, mapDeleteErr(err)
		}
		deleted += int(n)
	}
	return deleted, nil
}

// scanID scans a row of one text column.
func scanID(s scanner) (string, error) {
	var id string
	err := s.Scan(&id)
	return id, err
}
