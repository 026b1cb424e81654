package store

import (
	"context"
	"fmt"
)

// DeleteEndedSandbox deletes sandbox id at once, as a retention sweep
// would once it is old enough (DeleteEndedSandboxes): only when it
// stopped or failed and no queued or executing run names it, with what
// the schema cascades to (its keys, its E2B record). It reports whether
// the row went; a row that is live, still needed or gone is left as it is.
func (q *Queries) DeleteEndedSandbox(ctx context.Context, id string) (bool, error) {
	cond := `status IN (?, ?)
		AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.sandbox_id = sandboxes.id AND r.status IN (?, ?))`
	n, err := q.deleteBatch(ctx, "sandboxes", []string{id}, cond, SandboxStopped, SandboxFailed, RunQueued, RunExecuting)
	if err != nil {
		return false, fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return n == 1, nil
}
