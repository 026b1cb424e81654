package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"
	"github.com/sandboxd/sandboxd/internal/edge"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/store"
)

// SnapshotsQuery is the query of GET /api/snapshots.
type SnapshotsQuery struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
	Limit     int    `json:"limit,omitempty" jsonschema:"minimum=1,maximum=100,default=50,description=At most this many of each list (snapshots and named)"`
	// SandboxID keeps the named snapshots taken of that sandbox.
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"description=Only the named snapshots taken of this sandbox"`
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
	// Named are the account's named snapshots, newest first (sandboxd).
	Named []contract.NamedSnapshot `json:"named" jsonschema:"description=The account's named snapshots (POST /api/sandboxes/{id}/snapshots), newest first"`
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
	out.SandboxID = q.Get("sandbox_id")
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
	resp := SnapshotsResponse{Status: "success", Snapshots: []SnapshotInfo{}, Named: []contract.NamedSnapshot{}}
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
	if s.opts.Templates != nil {
		named, err := s.opts.Templates.Snapshots(ctx, account, q.SandboxID)
		if err != nil {
			return err
		}
		for _, t := range named[:min(len(named), q.Limit)] {
			resp.Named = append(resp.Named, contract.NamedSnapshotView(t))
		}
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

// The named snapshots (contract.NamedSnapshot): a sandbox's files saved
// under a name of its account, stored as templates of kind snapshot
// (templates.Service.Snapshot).

// createSnapshot is POST /api/sandboxes/{id}/snapshots: the caller's
// running sandbox's files saved as a named snapshot of its account (on
// the node that hosts it, as every sandbox route).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	req, sb, err := bindSandbox(s, w, r, contract.ParseCreateSnapshot)
	if err != nil {
		return err
	}
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	t, err := s.opts.Templates.Snapshot(r.Context(), principal(r), sb.ID, req.Name)
	if err != nil {
		return edge.Explained(err, "Sandbox not found")
	}
	writeJSON(w, http.StatusOK, contract.NamedSnapshotResponse{Status: "success", Snapshot: contract.NamedSnapshotView(t)})
	return nil
}

// NamedSnapshotQuery is the query of the routes of one named snapshot.
type NamedSnapshotQuery struct {
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

// namedSnapshot is the named snapshot the path names, of the account the
// query's account_id (or the key) acts for.
func (s *Server) namedSnapshot(r *http.Request) (store.Template, string, error) {
	if s.opts.Templates == nil {
		return store.Template{}, "", errNotAvailable
	}
	requested, err := contract.QueryAccountID(r.URL.Query())
	if err != nil {
		return store.Template{}, "", err
	}
	account, err := s.actFor(r, requested)
	if err != nil {
		return store.Template{}, "", err
	}
	t, err := s.opts.Templates.GetSnapshot(r.Context(), account, snapshotRef(r))
	return t, account, err
}

// snapshotRef is the path's {name}, unescaped: clients may escape the
// ':' of a name:tag (%3A).
func snapshotRef(r *http.Request) string {
	return edge.Unescaped(chi.URLParam(r, "name"))
}

// getNamedSnapshot is GET /api/snapshots/{name}.
func (s *Server) getNamedSnapshot(w http.ResponseWriter, r *http.Request) error {
	t, _, err := s.namedSnapshot(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.NamedSnapshotResponse{Status: "success", Snapshot: contract.NamedSnapshotView(t)})
	return nil
}

// deleteNamedSnapshot is DELETE /api/snapshots/{name}: answers the
// snapshot as it was.
func (s *Server) deleteNamedSnapshot(w http.ResponseWriter, r *http.Request) error {
	t, account, err := s.namedSnapshot(r)
	if err != nil {
		return err
	}
	if t, err = s.opts.Templates.DeleteSnapshot(r.Context(), account, t.ID); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.NamedSnapshotResponse{Status: "success", Snapshot: contract.NamedSnapshotView(t)})
	return nil
}

// promoteSnapshot is POST /api/snapshots/{name}/template: a template of
// the account with the snapshot's files.
func (s *Server) promoteSnapshot(w http.ResponseWriter, r *http.Request) error {
	req, account, err := bindBody(s, w, r, contract.ParsePromoteSnapshot)
	if err != nil {
		return err
	}
	if s.opts.Templates == nil {
		return errNotAvailable
	}
	t, err := s.opts.Templates.PromoteSnapshot(r.Context(), account, snapshotRef(r), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, contract.TemplateResponse{Status: "success", Template: contract.TemplateView(t, false)})
	return nil
}
