package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// E2BSandbox is what the E2B-compatible API keeps about a sandbox it
// created (package e2b).
type E2BSandbox struct {
	SandboxID  string
	AccountID  string
	TemplateID string
	Metadata   map[string]string
	// EnvVars are given to every process the E2B API starts in it.
	EnvVars     map[string]string
	AccessToken string
	// TrafficToken, when set, is what a request to the sandbox's ports
	// through the E2B domain must carry; "" leaves them public.
	TrafficToken string
	// AutoResume: traffic to the sandbox while it is paused resumes it
	// (E2B's autoResume).
	AutoResume bool
	CreatedAt  time.Time
}

const e2bSandboxCols = "sandbox_id, account_id, template_id, metadata, env_vars, access_token, traffic_token, auto_resume, created_at"

func scanE2BSandbox(s scanner) (E2BSandbox, error) {
	var (
		e         E2BSandbox
		meta, env string
		at        int64
	)
	if err := s.Scan(&e.SandboxID, &e.AccountID, &e.TemplateID, &meta, &env, &e.AccessToken, &e.TrafficToken, &e.AutoResume, &at); err != nil {
		return E2BSandbox{}, err
	}
	if err := json.Unmarshal([]byte(meta), &e.Metadata); err != nil {
		return E2BSandbox{}, fmt.Errorf("metadata of sandbox %s: %w", e.SandboxID, err)
	}
	if err := json.Unmarshal([]byte(env), &e.EnvVars); err != nil {
		return E2BSandbox{}, fmt.Errorf("environment of sandbox %s: %w", e.SandboxID, err)
	}
	e.CreatedAt = fromMillis(at)
	return e, nil
}

// CreateE2BSandbox records e for its sandbox, whose row must exist.
func (q *Queries) CreateE2BSandbox(ctx context.Context, e E2BSandbox) error {
	meta, err := jsonObject(e.Metadata)
	if err != nil {
		return fmt.Errorf("record e2b sandbox %s: %w", e.SandboxID, err)
	}
	env, err := jsonObject(e.EnvVars)
	if err != nil {
		return fmt.Errorf("record e2b sandbox %s: %w", e.SandboxID, err)
	}
	if _, err := q.exec(ctx, "INSERT INTO e2b_sandboxes ("+e2bSandboxCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
		e.SandboxID, e.AccountID, e.TemplateID, meta, env, e.AccessToken, e.TrafficToken, e.AutoResume, toMillis(e.CreatedAt)); err != nil {
		return fmt.Errorf("record e2b sandbox %s: %w", e.SandboxID, err)
	}
	return nil
}

// GetE2BSandbox returns what the E2B API recorded of sandbox id;
// ErrNotFound for a sandbox it did not create.
func (q *Queries) GetE2BSandbox(ctx context.Context, id string) (E2BSandbox, error) {
	e, err := scanE2BSandbox(q.queryRow(ctx, "SELECT "+e2bSandboxCols+" FROM e2b_sandboxes WHERE sandbox_id = ?", id))
	if err != nil {
		return E2BSandbox{}, fmt.Errorf("get e2b sandbox %s: %w", id, notFound(err))
	}
	return e, nil
}

// E2BPage is one page of ListLiveE2BSandboxes: at most Limit records
// from the one after After (the zero Cursor: from the first), newest
// first unless Ascending, none created before StartedAfter (when set).
type E2BPage struct {
	After        Cursor
	Limit        int
	Ascending    bool
	StartedAfter time.Time
}

// ListLiveE2BSandboxes returns a page of the E2B records of accountID's
// live sandboxes (pending or running, paused ones included), in the order
// they were created. The sandboxes' status is read in the same query, so
// the account's ended sandboxes, however many, never push a live one off
// a page.
func (q *Queries) ListLiveE2BSandboxes(ctx context.Context, accountID string, page E2BPage) ([]E2BSandbox, error) {
	past, args := page.After.older("e.created_at", "e.sandbox_id")
	order := "DESC"
	if page.Ascending {
		past, args = page.After.newer("e.created_at", "e.sandbox_id")
		order = "ASC"
	}
	where := "e.account_id = ? AND s.status IN (?, ?) AND " + past
	args = append([]any{accountID, SandboxPending, SandboxRunning}, args...)
	if !page.StartedAfter.IsZero() {
		where += " AND e.created_at >= ?"
		args = append(args, toMillis(page.StartedAfter))
	}
	out, err := q.listE2B(ctx, where+" ORDER BY e.created_at "+order+", e.sandbox_id "+order+" LIMIT ?", append(args, page.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("list live e2b sandboxes of %s: %w", accountID, err)
	}
	return out, nil
}

// Cursor is where a list that ended with e goes on (ListLiveE2BSandboxes).
func (e E2BSandbox) Cursor() Cursor { return Cursor{CreatedAt: e.CreatedAt, ID: e.SandboxID} }

// ListLiveE2BSandboxesOn returns the E2B records of the running sandboxes
// node hosts ("": any node): the candidates a signed file link may be for.
func (q *Queries) ListLiveE2BSandboxesOn(ctx context.Context, nodeID string) ([]E2BSandbox, error) {
	where, args := "s.status = 'running'", []any{}
	if nodeID != "" {
		where, args = where+" AND s.node_id = ?", append(args, nodeID)
	}
	out, err := q.listE2B(ctx, where, args...)
	if err != nil {
		return nil, fmt.Errorf("list e2b sandboxes on node %s: %w", nodeID, err)
	}
	return out, nil
}

// listE2B returns the E2B records joined with their sandboxes' rows (alias
// s) that where selects.
func (q *Queries) listE2B(ctx context.Context, where string, args ...any) ([]E2BSandbox, error) {
	return queryAll(ctx, q, scanE2BSandbox, "SELECT "+prefixCols("e", e2bSandboxCols)+" FROM e2b_sandboxes e JOIN sandboxes s ON s.id = e.sandbox_id WHERE "+where, args...)
}

// jsonObject encodes m as a JSON object, {} for nil.
func jsonObject(m map[string]string) (string, error) {
	if m == nil {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}
