package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/store"
)

// setNextCursor sends where the next page begins, when one follows.
func setNextCursor(w http.ResponseWriter, next store.Cursor) {
	if !next.IsZero() {
		w.Header().Set(contract.NextCursorHeader, next.String())
	}
}

// sandboxRows returns the sandboxes GET /api/sandboxes lists, newest
// first, and where its next page begins (zero: none follows, or the list
// is not paged): the one sandbox_id names, a page, or the unpaged list.
func (s *Server) sandboxRows(ctx context.Context, account string, q contract.ListSandboxesQuery) ([]store.Sandbox, store.Cursor, error) {
	switch {
	case q.SandboxID != "":
		sb, err := s.opts.Store.GetSandbox(ctx, q.SandboxID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && sb.AccountID != account) {
			return nil, store.Cursor{}, nil // a filter matching none of the account's
		}
		if err != nil {
			return nil, store.Cursor{}, fmt.Errorf("get sandbox %s: %w", q.SandboxID, err)
		}
		return []store.Sandbox{sb}, store.Cursor{}, nil
	case q.Paged():
		// One more than the page says whether another follows.
		rows, err := s.opts.Store.ListSandboxesPage(ctx, account, q.After(), q.Limit+1)
		if err != nil || len(rows) <= q.Limit {
			return rows, store.Cursor{}, err
		}
		rows = rows[:q.Limit]
		last := rows[len(rows)-1]
		return rows, store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}, nil
	default:
		rows, err := s.newestAndActive(ctx, account)
		return rows, store.Cursor{}, err
	}
}

// newestAndActive is the list without paging: the account's newest
// contract.UnpagedSandboxes sandboxes and every active one older than those, newest
// first. However many sandboxes ended since, a live one is always listed.
func (s *Server) newestAndActive(ctx context.Context, account string) ([]store.Sandbox, error) {
	rows, err := s.opts.Store.ListSandboxesPage(ctx, account, store.Cursor{}, contract.UnpagedSandboxes)
	if err != nil || len(rows) < contract.UnpagedSandboxes {
		return rows, err // all of them
	}
	active, err := s.opts.Store.ListActiveSandboxes(ctx, account)
	if err != nil {
		return nil, err
	}
	listed := make(map[string]bool, len(rows))
	for _, sb := range rows {
		listed[sb.ID] = true
	}
	for _, sb := range active {
		if !listed[sb.ID] {
			rows = append(rows, sb)
		}
	}
	// A sandbox created between the two reads is newer than the rest.
	slices.SortStableFunc(rows, func(a, b store.Sandbox) int {
		return cmp.Or(b.CreatedAt.Compare(a.CreatedAt), cmp.Compare(b.ID, a.ID))
	})
	return rows, nil
}

// runRows returns a page of the account's runs, newest first, and where
// the next page begins (zero: none follows).
func (s *Server) runRows(ctx context.Context, account string, q contract.RunsQuery) ([]store.Run, store.Cursor, error) {
	rows, err := s.opts.Store.ListRunsPage(ctx, account, q.After(), q.Limit+1)
	if err != nil || len(rows) <= q.Limit {
		return rows, store.Cursor{}, err
	}
	rows = rows[:q.Limit]
	last := rows[len(rows)-1]
	return rows, store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}, nil
}
