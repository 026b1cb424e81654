package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

const runCols = "id, account_id, sandbox_id, task, status, payload, output, error, tags, created_at, updated_at, started_at, finished_at"

func scanRun(s scanner) (Run, error) {
	var r Run
	var sandboxID, output, errJSON sql.NullString
	var payload, tags string
	var created, updated int64
	var started, finished sql.NullInt64
	if err := s.Scan(&r.ID, &r.AccountID, &sandboxID, &r.Task, &r.Status, &payload, &output, &errJSON, &tags,
		&created, &updated, &started, &finished); err != nil {
		return Run{}, err
	}
	r.SandboxID = sandboxID.String
	r.Payload = json.RawMessage(payload)
	if output.Valid {
		r.Output = json.RawMessage(output.String)
	}
	if errJSON.Valid {
		r.Error = json.RawMessage(errJSON.String)
	}
	if err := json.Unmarshal([]byte(tags), &r.Tags); err != nil {
		return Run{}, fmt.Errorf("decode tags of run %s: %w", r.ID, err)
	}
	if r.Tags == nil {
		r.Tags = []string{}
	}
	r.CreatedAt = fromMillis(created)
	r.UpdatedAt = fromMillis(updated)
	r.StartedAt = fromNullMillis(started)
	r.FinishedAt = fromNullMillis(finished)
	return r, nil
}

// finalRunStatuses are the statuses a run ends in.
var finalRunStatuses = map[RunStatus]bool{
	RunCompleted: true, RunFailed: true, RunCrashed: true, RunCanceled: true,
}

// nullJSON stores an absent document (nil or empty) as NULL and checks that a
// present one is JSON, so that what is read back can be embedded in a
// response as is.
func nullJSON(what string, doc json.RawMessage) (any, error) {
	if len(doc) == 0 {
		return nil, nil
	}
	if !json.Valid(doc) {
		return nil, fmt.Errorf("%w: %s is not valid JSON", ErrInvalid, what)
	}
	return string(doc), nil
}

// CreateRun inserts r. It fills an empty ID with "run_" and 32 random hex
// digits, an empty Status with RunQueued, nil Tags with none, a zero
// CreatedAt with now and a zero UpdatedAt with CreatedAt. An empty Payload is
// stored as JSON null. Payload, Output and Error must be JSON (ErrInvalid);
// an unknown account is ErrNotFound.
func (q *Queries) CreateRun(ctx context.Context, r *Run) error {
	if r == nil {
		return fmt.Errorf("create run: %w: nil run", ErrInvalid)
	}
	if r.ID == "" {
		r.ID = "run_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	}
	if r.Status == "" {
		r.Status = RunQueued
	}
	if r.Tags == nil {
		r.Tags = []string{}
	}
	if len(r.Payload) == 0 {
		r.Payload = json.RawMessage("null")
	}
	payload, err := nullJSON("payload", r.Payload)
	if err != nil {
		return fmt.Errorf("create run %s: %w", r.ID, err)
	}
	output, err := nullJSON("output", r.Output)
	if err != nil {
		return fmt.Errorf("create run %s: %w", r.ID, err)
	}
	errJSON, err := nullJSON("error", r.Error)
	if err != nil {
		return fmt.Errorf("create run %s: %w", r.ID, err)
	}
	tags, err := json.Marshal(r.Tags)
	if err != nil {
		return fmt.Errorf("create run %s: encode tags: %w", r.ID, err)
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = nowMS()
	}
	r.CreatedAt = ms(r.CreatedAt)
	if r.UpdatedAt.IsZero() {
		r.UpdatedAt = r.CreatedAt
	}
	r.UpdatedAt = ms(r.UpdatedAt)
	r.StartedAt = msPtr(r.StartedAt)
	r.FinishedAt = msPtr(r.FinishedAt)
	_, err = q.exec(ctx, "INSERT INTO runs ("+runCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		r.ID, r.AccountID, nullString(r.SandboxID), r.Task, r.Status, payload, output, errJSON, string(tags),
		toMillis(r.CreatedAt), toMillis(r.UpdatedAt), nullMillis(r.StartedAt), nullMillis(r.FinishedAt))
	if err != nil {
		return fmt.Errorf("create run %s: %w", r.ID, mapErr(err))
	}
	return nil
}

// GetRun returns the run with the given id.
func (q *Queries) GetRun(ctx context.Context, id string) (Run, error) {
	r, err := scanRun(q.queryRow(ctx, "SELECT "+runCols+" FROM runs WHERE id = ?", id))
	if err != nil {
		return Run{}, fmt.Errorf("get run %s: %w", id, notFound(err))
	}
	return r, nil
}

// ListRuns returns the runs of accountID (of every account when accountID is
// empty), newest first, at most limit of them (all when limit <= 0).
func (q *Queries) ListRuns(ctx context.Context, accountID string, limit int) ([]Run, error) {
	return q.ListRunsPage(ctx, accountID, Cursor{}, limit)
}

// ListRunsPage is ListRuns from the run after after (the zero Cursor: from
// the newest).
func (q *Queries) ListRunsPage(ctx context.Context, accountID string, after Cursor, limit int) ([]Run, error) {
	past, args := after.older("created_at", "id")
	query := "SELECT " + runCols + " FROM runs WHERE " + past
	if accountID != "" {
		query += " AND account_id = ?"
		args = append(args, accountID)
	}
	query += " ORDER BY created_at DESC, id DESC"
	if limit > 0 {
		query += " LIMIT ?"
		args = append(args, limit)
	}
	out, err := queryAll(ctx, q, scanRun, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list runs of %q: %w", accountID, err)
	}
	return out, nil
}

// FinishedRunsPast returns the ids of accountID's finished runs that come
// after its newest skip runs (of any status), newest first, looking at no
// more than limit runs past them. Package runs deletes the logs of these:
// it keeps the logs of an account's newest runs only.
func (q *Queries) FinishedRunsPast(ctx context.Context, accountID string, skip, limit int) ([]string, error) {
	type ref struct {
		id     string
		status RunStatus
	}
	refs, err := queryAll(ctx, q, func(s scanner) (ref, error) {
		var r ref
		return r, s.Scan(&r.id, &r.status)
	}, "SELECT id, status FROM runs WHERE account_id = ? ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?", accountID, limit, skip)
	if err != nil {
		return nil, fmt.Errorf("list older runs of %s: %w", accountID, err)
	}
	var ids []string
	for _, r := range refs {
		if finalRunStatuses[r.status] {
			ids = append(ids, r.id)
		}
	}
	return ids, nil
}

// DeleteFinishedRuns deletes the runs of ids that are finished (a run
// still queued or executing is left alone) and says how many went.
func (q *Queries) DeleteFinishedRuns(ctx context.Context, ids []string) (int, error) {
	fin, args := inList(finalRunStatusList())
	n, err := q.deleteBatch(ctx, "runs", ids, "status IN ("+fin+")", args...)
	if err != nil {
		return n, fmt.Errorf("delete finished runs: %w", err)
	}
	return n, nil
}

// finalRunStatusList is finalRunStatuses as a list, sorted so that the
// queries made of it read the same every time.
func finalRunStatusList() []RunStatus {
	return slices.Sorted(maps.Keys(finalRunStatuses))
}

// ListRunsByStatus returns the runs whose status is one of statuses (every
// run when none are given), oldest first.
func (q *Queries) ListRunsByStatus(ctx context.Context, statuses ...RunStatus) ([]Run, error) {
	query := "SELECT " + runCols + " FROM runs"
	var args []any
	if len(statuses) > 0 {
		var in string
		in, args = inList(statuses)
		query += " WHERE status IN (" + in + ")"
	}
	out, err := queryAll(ctx, q, scanRun, query+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, fmt.Errorf("list runs by status: %w", err)
	}
	return out, nil
}

// StartRun moves run id from QUEUED to EXECUTING, started at the given time,
// and reports whether it did (false, nil when the run is not QUEUED;
// ErrNotFound when there is no such run).
func (q *Queries) StartRun(ctx context.Context, id string, at time.Time) (bool, error) {
	v := toMillis(ms(at))
	n, err := q.execCount(ctx, "UPDATE runs SET status = ?, started_at = ?, updated_at = ? WHERE id = ? AND status = ?",
		RunExecuting, v, v, id, RunQueued)
	if err != nil {
		return false, fmt.Errorf("start run %s: %w", id, err)
	}
	return q.changed(ctx, n, "runs", id, "start run")
}

// FinishRun moves run id from QUEUED or EXECUTING to the final status,
// records its output and error (JSON; nil or empty for none) and when it
// finished, and reports whether it did (false, nil when the run had already
// finished; ErrNotFound when there is no such run). A status that is not
// final is ErrInvalid.
func (q *Queries) FinishRun(ctx context.Context, id string, status RunStatus, output, errJSON json.RawMessage, at time.Time) (bool, error) {
	if !finalRunStatuses[status] {
		return false, fmt.Errorf("finish run %s: %w: %q is not a final status", id, ErrInvalid, status)
	}
	out, err := nullJSON("output", output)
	if err != nil {
		return false, fmt.Errorf("finish run %s: %w", id, err)
	}
	errDoc, err := nullJSON("error", errJSON)
	if err != nil {
		return false, fmt.Errorf("finish run %s: %w", id, err)
	}
	v := toMillis(ms(at))
	var changed bool
	err = q.atomically(ctx, func(q *Queries) error {
		n, err := q.execCount(ctx, `UPDATE runs SET status = ?, output = ?, error = ?, finished_at = ?, updated_at = ?
			WHERE id = ? AND status IN (?, ?)`, status, out, errDoc, v, v, id, RunQueued, RunExecuting)
		if err != nil {
			return fmt.Errorf("finish run %s: %w", id, mapErr(err))
		}
		if changed, err = q.changed(ctx, n, "runs", id, "finish run"); err != nil || !changed {
			return err
		}
		var account, sandbox, task string
		if err := q.queryRow(ctx, "SELECT account_id, COALESCE(sandbox_id, ''), task FROM runs WHERE id = ?", id).Scan(&account, &sandbox, &task); err != nil {
			return fmt.Errorf("finish run %s: %w", id, err)
		}
		return q.insertEvent(ctx, Event{AccountID: account, SandboxID: sandbox, Type: EventRunFinished, CreatedAt: at},
			map[string]any{"run_id": id, "status": status, "task": task})
	})
	return changed, err
}

// SetRunSandbox records the sandbox a task's run started for itself (a
// command's run names its sandbox from the start), once: it reports
// whether it did (false when the run names one already; ErrNotFound when
// there is no such run).
func (q *Queries) SetRunSandbox(ctx context.Context, runID, sandboxID string) (bool, error) {
	n, err := q.execCount(ctx, "UPDATE runs SET sandbox_id = ? WHERE id = ? AND sandbox_id IS NULL", sandboxID, runID)
	if err != nil {
		return false, fmt.Errorf("set sandbox of run %s: %w", runID, mapErr(err))
	}
	return q.changed(ctx, n, "runs", runID, "set sandbox of run")
}

// LatestRunIDs returns, for each of sandboxIDs that a run names, the id of
// the newest such run: one query for a list of sandboxes.
func (q *Queries) LatestRunIDs(ctx context.Context, sandboxIDs []string) (map[string]string, error) {
	out := map[string]string{}
	if len(sandboxIDs) == 0 {
		return out, nil
	}
	in, args := inList(sandboxIDs)
	rows, err := q.query(ctx, "SELECT sandbox_id, id FROM runs WHERE sandbox_id IN ("+in+") ORDER BY created_at, id", args...)
	if err != nil {
		return nil, fmt.Errorf("latest runs of %d sandboxes: %w", len(sandboxIDs), err)
	}
	defer rows.Close()
	for rows.Next() {
		var sandboxID, runID string
		if err := rows.Scan(&sandboxID, &runID); err != nil {
			return nil, fmt.Errorf("latest runs of %d sandboxes: %w", len(sandboxIDs), err)
		}
		out[sandboxID] = runID // in order: the newest is written last
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("latest runs of %d sandboxes: %w", len(sandboxIDs), err)
	}
	return out, nil
}

// changed turns the row count of a compare-and-set update into its result:
// true when a row changed, false when the row exists in another state,
// ErrNotFound when it does not exist.
func (q *Queries) changed(ctx context.Context, n int64, table, id, doing string) (bool, error) {
	if n > 0 {
		return true, nil
	}
	ok, err := q.exists(ctx, table, "id", id)
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", doing, id, err)
	}
	if !ok {
		return false, fmt.Errorf("%s %s: %w", doing, id, ErrNotFound)
	}
	return false, nil
}
