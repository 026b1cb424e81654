package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/store"
)

// SnapshotsQuery is the query of GET /api/snapshots.
type SnapshotsQuery struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
	Limit     int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100,default=50"`
}

func (q SnapshotsQuery) ActingFor() string { return q.AccountID }

// SnapshotsResponse answers GET /api/snapshots: the account's snapshot
// history, newest first, and which one its next sandbox starts from.
type SnapshotsResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
	// SnapshotID is the account's snapshot (GET /api/sandboxes'
	// snapshot_id): null when it has none or its row expired.
	SnapshotID *string        `json:"snapshot_id" jsonschema:"nullable"`
	ExpiresAt  *string        `json:"expires_at" jsonschema:"nullable"`
	Snapshots  []SnapshotInfo `json:"snapshots"`
}

// SnapshotInfo is one snapshot of an account: a filesystem layer chained to
// its parent. Where the layer is stored and which image it sits on are the
// server's business (they may name host paths) and are not shown.
type SnapshotInfo struct {
	ID string `json:"id"`
	// ParentID is the snapshot this one was taken on top of; null for a
	// layer over the base image alone.
	ParentID *string `json:"parent_id" jsonschema:"nullable"`
	// SandboxID is the sandbox it was taken of, when known.
	SandboxID *string `json:"sandbox_id" jsonschema:"nullable"`
	Size      int64   `json:"size" jsonschema:"description=Bytes of the stored (compressed) layer"`
	Depth     int     `json:"depth" jsonschema:"description=Layers from the base image to this one"`
	CreatedAt string  `json:"created_at"`
	// Current: the account's next sandbox starts from this one.
	Current bool `json:"current"`
}

// parseSnapshotsQuery validates the query of GET /api/snapshots.
func parseSnapshotsQuery(q url.Values) (SnapshotsQuery, error) {
	out := SnapshotsQuery{Limit: 50}
	var err error
	if out.Limit, err = contract.QueryLimit(q, out.Limit); err != nil {
		return out, err
	}
	out.AccountID, err = contract.QueryAccountID(q)
	return out, err
}

// listSnapshots answers the account's snapshots, newest first. Read only:
// choosing one is PATCH /api/sandboxes.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q, account, err := bindQuery(s, w, r, parseSnapshotsQuery)
	if err != nil {
		return err
	}
	ctx := r.Context()
	env, err := s.opts.Store.GetEnvironment(ctx, account)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("get environment of %s: %w", account, err)
	}
	resp := SnapshotsResponse{Status: "success", Snapshots: []SnapshotInfo{}}
	if err == nil && s.environmentLive(env) && env.SnapshotID != nil && *env.SnapshotID != "" {
		resp.SnapshotID = env.SnapshotID
		exp := contract.FormatTime(env.ExpiresAt)
		resp.ExpiresAt = &exp
	}
	snaps, err := s.opts.Store.ListSnapshots(ctx, account)
	if err != nil {
		return fmt.Errorf("list snapshots of %s: %w", account, err)
	}
	for _, sn := range snaps[:min(len(snaps), q.Limit)] {
		resp.Snapshots = append(resp.Snapshots, SnapshotInfo{
			ID:        sn.ID,
			ParentID:  optional(sn.ParentID),
			SandboxID: optional(sn.SandboxID),
			Size:      sn.Size,
			Depth:     sn.Depth,
			CreatedAt: contract.FormatTime(sn.CreatedAt),
			Current:   resp.SnapshotID != nil && *resp.SnapshotID == sn.ID,
		})
	}
	writeJSON(w, http.StatusOK, resp)
	return nil
}

// optional is s as a JSON string, or null when empty.
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
