package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
)

const sandboxCols = "id, account_id, node_id, status, runtime, failure_reason, snapshot_id, created_at, updated_at, deadline, stopped_at, network, pause, paused_remaining_ms, forked_from, on_timeout, task, template_id, paused_files, paused_state"

func scanSandbox(s scanner) (Sandbox, error) {
	var sb Sandbox
	var snapshotID sql.NullString
	var created, updated, deadline int64
	var stopped, remaining sql.NullInt64
	if err := s.Scan(&sb.ID, &sb.AccountID, &sb.NodeID, &sb.Status, &sb.Runtime, &sb.FailureReason, &snapshotID,
		&created, &updated, &deadline, &stopped, &sb.Network, &sb.Pause, &remaining, &sb.ForkedFrom, &sb.OnTimeout, &sb.Task, &sb.TemplateID, &sb.PausedFiles, &sb.PausedState); err != nil {
		return Sandbox{}, err
	}
	sb.PausedRemaining = time.Duration(remaining.Int64) * time.Millisecond
	sb.SnapshotID = snapshotID.String
	sb.CreatedAt = fromMillis(created)
	sb.UpdatedAt = fromMillis(updated)
	sb.Deadline = fromMillis(deadline)
	sb.StoppedAt = fromNullMillis(stopped)
	return sb, nil
}

// activeSandboxStatuses are the statuses that hold resources on a node.
var activeSandboxStatuses = []SandboxStatus{SandboxPending, SandboxRunning, SandboxStopping}

// CreateSandbox inserts sb. It fills an empty ID with a random UUID, an empty
// Status with SandboxPending, a zero CreatedAt with now and a zero UpdatedAt
// with CreatedAt. An unknown account or snapshot is ErrNotFound; an unknown
// status is ErrInvalid.
func (q *Queries) CreateSandbox(ctx context.Context, sb *Sandbox) error {
	if sb == nil {
		return fmt.Errorf("create sandbox: %w: nil sandbox", ErrInvalid)
	}
	if sb.ID == "" {
		sb.ID = uuid.NewString()
	}
	if sb.Status == "" {
		sb.Status = SandboxPending
	}
	if sb.CreatedAt.IsZero() {
		sb.CreatedAt = nowMS()
	}
	sb.CreatedAt = ms(sb.CreatedAt)
	if sb.UpdatedAt.IsZero() {
		sb.UpdatedAt = sb.CreatedAt
	}
	sb.UpdatedAt = ms(sb.UpdatedAt)
	sb.Deadline = ms(sb.Deadline)
	sb.StoppedAt = msPtr(sb.StoppedAt)
	sb.Pause, sb.PausedRemaining, sb.PausedFiles, sb.PausedState = "", 0, false, "" // a new sandbox is not paused
	if sb.OnTimeout != "" && sb.OnTimeout != OnTimeoutPause && sb.OnTimeout != OnTimeoutPauseFiles {
		return fmt.Errorf("create sandbox: %w: on_timeout %q", ErrInvalid, sb.OnTimeout)
	}
	return q.atomically(ctx, func(q *Queries) error {
		_, err := q.exec(ctx, "INSERT INTO sandboxes ("+sandboxCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
			sb.ID, sb.AccountID, sb.NodeID, sb.Status, sb.Runtime, sb.FailureReason, nullString(sb.SnapshotID),
			toMillis(sb.CreatedAt), toMillis(sb.UpdatedAt), toMillis(sb.Deadline), nullMillis(sb.StoppedAt), sb.Network, "", nil, sb.ForkedFrom, sb.OnTimeout, sb.Task, sb.TemplateID, false, "")
		if err != nil {
			return fmt.Errorf("create sandbox %s: %w", sb.ID, mapErr(err))
		}
		if err := q.attachVolumes(ctx, sb); err != nil {
			return err
		}
		data := map[string]any{"timeout_at": sb.Deadline}
		if sb.TemplateID != "" {
			data["template_id"] = sb.TemplateID
		}
		if sb.ForkedFrom != "" {
			data["forked_from"] = sb.ForkedFrom
		}
		if sb.Task != "" {
			data["task"] = sb.Task
		}
		return q.insertEvent(ctx, Event{AccountID: sb.AccountID, SandboxID: sb.ID, Type: EventCreated, CreatedAt: sb.CreatedAt}, data)
	})
}

// GetSandbox returns the sandbox with the given id.
func (q *Queries) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	sb, err := scanSandbox(q.queryRow(ctx, "SELECT "+sandboxCols+" FROM sandboxes WHERE id = ?", id))
	if err != nil {
		return Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, notFound(err))
	}
	return sb, nil
}

// ListSandboxes returns the sandboxes of accountID, newest first.
func (q *Queries) ListSandboxes(ctx context.Context, accountID string) ([]Sandbox, error) {
	out, err := queryAll(ctx, q, scanSandbox, "SELECT "+sandboxCols+" FROM sandboxes WHERE account_id = ? ORDER BY created_at DESC, id DESC", accountID)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of %s: %w", accountID, err)
	}
	return out, nil
}

// listed leaves out of the account's lists the sandboxes of its setup,
// which the service started for it unasked (they are still found by id).
const listed = "task <> '" + SandboxTaskSetup + "'"

// ListSandboxesPage returns at most limit sandboxes of accountID, newest
// first, from the one after after (the zero Cursor: from the newest); not
// those of its setup (SandboxTaskSetup).
func (q *Queries) ListSandboxesPage(ctx context.Context, accountID string, after Cursor, limit int) ([]Sandbox, error) {
	past, args := after.older("created_at", "id")
	out, err := queryAll(ctx, q, scanSandbox, "SELECT "+sandboxCols+" FROM sandboxes WHERE account_id = ? AND "+listed+" AND "+past+
		" ORDER BY created_at DESC, id DESC LIMIT ?", append(append([]any{accountID}, args...), limit)...)
	if err != nil {
		return nil, fmt.Errorf("list a page of sandboxes of %s: %w", accountID, err)
	}
	return out, nil
}

// ListActiveSandboxes returns the pending, running (paused ones included)
// and stopping sandboxes of accountID, newest first: those a list must
// show however many ended ones are newer (not those of its setup, which
// no list shows). There are as many as the account runs at once, which
// its quota bounds.
func (q *Queries) ListActiveSandboxes(ctx context.Context, accountID string) ([]Sandbox, error) {
	in, args := inList(activeSandboxStatuses)
	out, err := queryAll(ctx, q, scanSandbox, "SELECT "+sandboxCols+" FROM sandboxes WHERE account_id = ? AND "+listed+" AND status IN ("+in+
		") ORDER BY created_at DESC, id DESC", append([]any{accountID}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("list active sandboxes of %s: %w", accountID, err)
	}
	return out, nil
}

// ListSandboxesByID returns the sandboxes of ids that exist, in no
// particular order: one query for the rows of a list of records that name
// them (package e2b's list).
func (q *Queries) ListSandboxesByID(ctx context.Context, ids []string) ([]Sandbox, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	in, args := inList(ids)
	out, err := queryAll(ctx, q, scanSandbox, "SELECT "+sandboxCols+" FROM sandboxes WHERE id IN ("+in+")", args...)
	if err != nil {
		return nil, fmt.Errorf("list %d sandboxes by id: %w", len(ids), err)
	}
	return out, nil
}

// ListSandboxesByNode returns the sandboxes placed on nodeID whose status is
// one of statuses (any status when none are given), oldest first.
func (q *Queries) ListSandboxesByNode(ctx context.Context, nodeID string, statuses ...SandboxStatus) ([]Sandbox, error) {
	query := "SELECT " + sandboxCols + " FROM sandboxes WHERE node_id = ?"
	args := []any{nodeID}
	if len(statuses) > 0 {
		in, inArgs := inList(statuses)
		query += " AND status IN (" + in + ")"
		args = append(args, inArgs...)
	}
	out, err := queryAll(ctx, q, scanSandbox, query+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of node %s: %w", nodeID, err)
	}
	return out, nil
}

// TransitionSandbox moves sandbox id to status to if its status is one of
// from, and reports whether it did (false, nil when the status is not one of
// from; ErrNotFound when there is no such sandbox). A non-empty reason
// replaces the failure reason. Moving to stopped or failed sets StoppedAt to
// at unless it is already set.
func (q *Queries) TransitionSandbox(ctx context.Context, id string, from []SandboxStatus, to SandboxStatus, reason string, at time.Time) (bool, error) {
	if len(from) == 0 {
		return false, nil
	}
	atMS := toMillis(ms(at))
	var stoppedAt any
	if to == SandboxStopped || to == SandboxFailed {
		stoppedAt = atMS
	}
	in, inArgs := inList(from)
	args := append([]any{to, atMS, nullString(reason), stoppedAt, id}, inArgs...)
	var changed bool
	err := q.atomically(ctx, func(q *Queries) error {
		n, err := q.execCount(ctx, `UPDATE sandboxes SET status = ?, updated_at = ?,
			failure_reason = COALESCE(?, failure_reason), stopped_at = COALESCE(stopped_at, ?)
			WHERE id = ? AND status IN (`+in+`)`, args...)
		if err != nil {
			return fmt.Errorf("transition sandbox %s to %s: %w", id, to, mapErr(err))
		}
		if changed, err = q.changed(ctx, n, "sandboxes", id, "transition sandbox to "+string(to)+":"); err != nil || !changed {
			return err
		}
		if typ, ok := statusEvents[to]; ok {
			return q.sandboxEvent(ctx, id, typ, nil, at)
		}
		return nil
	})
	return changed, err
}

// statusEvents are the events of the statuses a sandbox moves to (pending
// is its creation's, stopping leads to stopped).
var statusEvents = map[SandboxStatus]string{SandboxRunning: EventRunning, SandboxStopped: EventStopped, SandboxFailed: EventFailed}

// SetSandboxDeadline sets when sandbox id times out.
func (q *Queries) SetSandboxDeadline(ctx context.Context, id string, deadline time.Time) error {
	return q.atomically(ctx, func(q *Queries) error {
		n, err := q.execCount(ctx, "UPDATE sandboxes SET deadline = ?, updated_at = ? WHERE id = ?",
			toMillis(ms(deadline)), toMillis(nowMS()), id)
		if err != nil {
			return fmt.Errorf("set deadline of sandbox %s: %w", id, err)
		}
		if n == 0 {
			return fmt.Errorf("set deadline of sandbox %s: %w", id, ErrNotFound)
		}
		return q.sandboxEvent(ctx, id, EventUpdated, map[string]any{"timeout_at": ms(deadline)}, nowMS())
	})
}

// SetSandboxNetwork records a running sandbox's new network policy (the
// API's JSON form). It reports false, changing nothing, when the sandbox
// is not running.
func (q *Queries) SetSandboxNetwork(ctx context.Context, id, network string) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET network = ?, updated_at = ? WHERE id = ? AND status = ?",
		network, toMillis(nowMS()), id, SandboxRunning)
	if err != nil {
		return false, fmt.Errorf("set network of sandbox %s: %w", id, err)
	}
	return n == 1, nil
}

// SetSandboxSnapshot records the snapshot a sandbox started from ("" for
// none). An unknown snapshot is ErrNotFound.
func (q *Queries) SetSandboxSnapshot(ctx context.Context, id, snapshotID string) error {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET snapshot_id = ?, updated_at = ? WHERE id = ?",
		nullString(snapshotID), toMillis(nowMS()), id)
	if err != nil {
		return fmt.Errorf("set snapshot of sandbox %s: %w", id, mapErr(err))
	}
	if n == 0 {
		return fmt.Errorf("set snapshot of sandbox %s: %w", id, ErrNotFound)
	}
	return nil
}

// ListExpiredSandboxes returns the pending or running sandboxes on nodeID (on
// every node when nodeID is empty) whose deadline is at or before now,
// earliest deadline first.
func (q *Queries) ListExpiredSandboxes(ctx context.Context, nodeID string, now time.Time) ([]Sandbox, error) {
	// A paused sandbox's deadline does not run (see BeginPause).
	query := "SELECT " + sandboxCols + " FROM sandboxes WHERE status IN (?, ?) AND pause = '' AND deadline <= ?"
	args := []any{SandboxPending, SandboxRunning, toMillis(ms(now))}
	if nodeID != "" {
		query += " AND node_id = ?"
		args = append(args, nodeID)
	}
	out, err := queryAll(ctx, q, scanSandbox, query+" ORDER BY deadline, id", args...)
	if err != nil {
		return nil, fmt.Errorf("list expired sandboxes of node %q: %w", nodeID, err)
	}
	return out, nil
}

// CountActiveSandboxes counts the pending, running and stopping sandboxes of
// accountID, or of every account when accountID is empty.
func (q *Queries) CountActiveSandboxes(ctx context.Context, accountID string) (int, error) {
	in, args := inList(activeSandboxStatuses)
	query := "SELECT COUNT(*) FROM sandboxes WHERE status IN (" + in + ")"
	if accountID != "" {
		query += " AND account_id = ?"
		args = append(args, accountID)
	}
	var n int
	if err := q.queryRow(ctx, query, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count active sandboxes of %q: %w", accountID, err)
	}
	return n, nil
}

// DeleteSandboxesOf deletes every sandbox row of accountID (and, through the
// schema, the keys minted for them). Callers stop the sandboxes first.
func (q *Queries) DeleteSandboxesOf(ctx context.Context, accountID string) error {
	if _, err := q.exec(ctx, "DELETE FROM sandboxes WHERE account_id = ?", accountID); err != nil {
		return fmt.Errorf("delete sandboxes of %s: %w", accountID, mapDeleteErr(err))
	}
	return nil
}

// BeginPause marks a running, unpaused sandbox pausing and records the
// lifetime it has left at now (its deadline stops running) and now as when
// its pause began (ListPausedBefore). It reports false, changing nothing,
// when the sandbox is not running or is already in a pause.
func (q *Queries) BeginPause(ctx context.Context, id string, now time.Time) (bool, error) {
	t := toMillis(ms(now))
	n, err := q.execCount(ctx, `UPDATE sandboxes SET pause = ?, updated_at = ?, paused_at = ?,
		paused_remaining_ms = CASE WHEN deadline > ? THEN deadline - ? ELSE 0 END
		WHERE id = ? AND status = ? AND pause = ''`,
		PausePausing, t, t, t, t, id, SandboxRunning)
	if err != nil {
		return false, fmt.Errorf("begin pause of sandbox %s: %w", id, err)
	}
	return n == 1, nil
}

// TransitionPause moves a running sandbox's pause state from one of from to
// to, and reports whether it did. Back to "" (resumed, or a pause undone),
// its deadline runs again: at plus the lifetime it had left.
func (q *Queries) TransitionPause(ctx context.Context, id string, from []string, to string, at time.Time) (bool, error) {
	if len(from) == 0 {
		return false, nil
	}
	t := toMillis(ms(at))
	in, inArgs := inList(from)
	set := "pause = ?, updated_at = ?"
	args := []any{to, t}
	if to == "" {
		set += ", deadline = ? + COALESCE(paused_remaining_ms, 0), paused_remaining_ms = NULL, paused_at = NULL, paused_files = FALSE, paused_state = ''"
		args = append(args, t)
	}
	args = append(append(args, id, SandboxRunning), inArgs...)
	var moved bool
	err := q.atomically(ctx, func(q *Queries) error {
		n, err := q.execCount(ctx, "UPDATE sandboxes SET "+set+" WHERE id = ? AND status = ? AND pause IN ("+in+")", args...)
		if err != nil {
			return fmt.Errorf("move pause of sandbox %s to %q: %w", id, to, err)
		}
		if moved = n == 1; !moved {
			return nil
		}
		// A pause that ends paused, or a resume that ends running; a pause
		// undone (pausing back to running) or a resume that failed
		// (resuming back to paused) changed nothing a user sees.
		switch {
		case to == PausePaused && slices.Contains(from, PausePausing):
			return q.sandboxEvent(ctx, id, EventPaused, nil, at)
		case to == "" && slices.Contains(from, PauseResuming):
			return q.sandboxEvent(ctx, id, EventResumed, nil, at)
		}
		return nil
	})
	return moved, err
}

// SetPausingFiles records that sandbox id's pause, under way, is of its
// files alone, saved as template templateID (its template from then on):
// from here the pause is finished, never undone, also after a crash
// (FinishFilesPause). It reports whether it did (false: the sandbox is no
// longer pausing).
func (q *Queries) SetPausingFiles(ctx context.Context, id, templateID string, at time.Time) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET paused_files = TRUE, template_id = ?, updated_at = ? WHERE id = ? AND status = ? AND pause = ?",
		templateID, toMillis(ms(at)), id, SandboxRunning, PausePausing)
	if err != nil {
		return false, fmt.Errorf("record the saved files of sandbox %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// FinishFilesPause ends a pause of the files alone (SetPausingFiles):
// sandbox id, pausing, is paused; its paused event says memory false and
// names the template its files are. It reports whether it did.
func (q *Queries) FinishFilesPause(ctx context.Context, id string, at time.Time) (bool, error) {
	var moved bool
	err := q.atomically(ctx, func(q *Queries) error {
		var templateID string
		err := q.writeQueryRow(ctx, "SELECT template_id FROM sandboxes WHERE id = ? AND status = ? AND pause = ? AND paused_files",
			id, SandboxRunning, PausePausing).Scan(&templateID)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("finish the pause of sandbox %s's files: %w", id, err)
		}
		if _, err := q.exec(ctx, "UPDATE sandboxes SET pause = ?, updated_at = ? WHERE id = ?", PausePaused, toMillis(ms(at)), id); err != nil {
			return fmt.Errorf("finish the pause of sandbox %s's files: %w", id, mapErr(err))
		}
		moved = true
		return q.sandboxEvent(ctx, id, EventPaused, map[string]any{"memory": false, "template_id": templateID}, at)
	})
	return moved, err
}

// AdoptFilesPaused makes node to the host of sandbox id, paused with its
// files alone (or pausing so) on node from, which is down: nothing of it
// is on from, and its pause's time limit and stop are to's to keep. It
// reports whether it did.
func (q *Queries) AdoptFilesPaused(ctx context.Context, id, from, to string) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET node_id = ? WHERE id = ? AND node_id = ? AND status = ? AND paused_files",
		to, id, from, SandboxRunning)
	if err != nil {
		return false, fmt.Errorf("adopt paused sandbox %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// SetPausedState records key as paused sandbox id's saved state in the
// blob store (its memory and files: any node can resume it from there),
// and reports whether the sandbox is still paused.
func (q *Queries) SetPausedState(ctx context.Context, id, key string) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET paused_state = ? WHERE id = ? AND status = ? AND pause = ?",
		key, id, SandboxRunning, PausePaused)
	if err != nil {
		return false, fmt.Errorf("record the saved state of sandbox %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// AdoptMovedPause makes node to the host of sandbox id, paused with its
// memory and its saved state in the blob store, while node from (which
// went down) still is; it reports whether it did.
func (q *Queries) AdoptMovedPause(ctx context.Context, id, from, to string) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET node_id = ? WHERE id = ? AND node_id = ? AND status = ? AND pause = ? AND paused_state <> ''",
		to, id, from, SandboxRunning, PausePaused)
	if err != nil {
		return false, fmt.Errorf("adopt paused sandbox %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// ClaimFilesResume moves sandbox id, paused with its files alone, to
// resuming on node nodeID, whichever node it was paused on (its files are
// in the blob store), and reports whether it did.
func (q *Queries) ClaimFilesResume(ctx context.Context, id, nodeID string, at time.Time) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET pause = ?, node_id = ?, updated_at = ? WHERE id = ? AND status = ? AND pause = ? AND paused_files",
		PauseResuming, nodeID, toMillis(ms(at)), id, SandboxRunning, PausePaused)
	if err != nil {
		return false, fmt.Errorf("claim the resume of sandbox %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}

// SetPausedRemaining sets the lifetime a paused sandbox will have when it
// resumes. It reports false when the sandbox is not in a pause.
func (q *Queries) SetPausedRemaining(ctx context.Context, id string, d time.Duration) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE sandboxes SET paused_remaining_ms = ?, updated_at = ? WHERE id = ? AND status = ? AND pause <> ''",
		d.Milliseconds(), toMillis(nowMS()), id, SandboxRunning)
	if err != nil {
		return false, fmt.Errorf("set remaining lifetime of paused sandbox %s: %w", id, err)
	}
	return n == 1, nil
}

// ListPausedBefore returns the paused sandboxes on nodeID (on every node
// when nodeID is empty) whose pause began at or before before, longest
// paused first. A sandbox pausing or resuming is not listed: its pause
// changes under way.
func (q *Queries) ListPausedBefore(ctx context.Context, nodeID string, before time.Time) ([]Sandbox, error) {
	query := "SELECT " + sandboxCols + " FROM sandboxes WHERE status = ? AND pause = ? AND paused_at <= ?"
	args := []any{SandboxRunning, PausePaused, toMillis(ms(before))}
	if nodeID != "" {
		query += " AND node_id = ?"
		args = append(args, nodeID)
	}
	out, err := queryAll(ctx, q, scanSandbox, query+" ORDER BY paused_at, id", args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of node %q paused before %v: %w", nodeID, before, err)
	}
	return out, nil
}

// BeginStopPaused moves a sandbox that is paused, and has been since at or
// before before, to stopping with reason, and reports whether it did: false,
// changing nothing, when it was resumed (or paused again since), is being
// resumed, or is no longer running. The checks and the move are one
// statement, so a resume that claimed the sandbox first (TransitionPause)
// is never stopped under it, and one that comes after finds it stopping.
func (q *Queries) BeginStopPaused(ctx context.Context, id string, before time.Time, reason string, at time.Time) (bool, error) {
	n, err := q.execCount(ctx, `UPDATE sandboxes SET status = ?, updated_at = ?, failure_reason = ?
		WHERE id = ? AND status = ? AND pause = ? AND paused_at <= ?`,
		SandboxStopping, toMillis(ms(at)), reason, id, SandboxRunning, PausePaused, toMillis(ms(before)))
	if err != nil {
		return false, fmt.Errorf("stop paused sandbox %s: %w", id, mapErr(err))
	}
	return n == 1, nil
}
