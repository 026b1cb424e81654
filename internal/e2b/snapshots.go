package e2b

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// E2B's snapshots (SDK: createSnapshot, listSnapshots, deleteSnapshot,
// Sandbox.create(snapshotId)) are sandboxd's named snapshots: templates of
// kind snapshot (templates.Service.Snapshot), which a create resolves as
// it resolves any template (customTemplate). A snapshot's id is its
// name:tag, E2B's form; an unnamed one's name is its template id.

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// snapshotOf renders t as E2B does: named ones list their name.
func snapshotOf(t store.Template) snapshotInfo {
	info := snapshotInfo{SnapshotID: t.Name + ":" + t.Tag, Names: []string{}}
	if t.Name != t.ID {
		info.Names = append(info.Names, t.Name)
	}
	return info
}

// createSnapshot is POST /sandboxes/{id}/snapshots {name?}: 201 with the
// snapshot, once it is ready. The sandbox runs on.
func (a *API) createSnapshot(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req struct {
		Name *string `json:"name"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if a.opts.Custom == nil {
		return edge.Errorf(http.StatusBadRequest, "this server has no templates, and so no snapshots")
	}
	sb, _, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	name := ""
	if req.Name != nil {
		if name = strings.TrimSpace(*req.Name); name == "" {
			return edge.Errorf(http.StatusBadRequest, "Invalid name: empty")
		}
		if strings.Contains(name, "/") {
			return edge.Errorf(http.StatusBadRequest, "Invalid name: %q: sandboxd's snapshot names have no namespace (give the name alone)", name)
		}
	}
	t, err := a.opts.Custom.Snapshot(r.Context(), c.Principal, sb.ID, name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotOf(t))
	return nil
}

// listSnapshots is GET /snapshots: the account's snapshots, newest first,
// of sandboxID and of name ("name" any tag, "name:tag" that one) when
// given; paged by limit (1–100, default 100) and nextToken (the
// X-Next-Token header).
func (a *API) listSnapshots(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	q := r.URL.Query()
	out := []snapshotInfo{}
	if a.opts.Custom == nil {
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	limit := 100
	if s := q.Get("limit"); s != "" {
		var err error
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 100 {
			return edge.Errorf(http.StatusBadRequest, "limit must be 1 to 100")
		}
	}
	after, err := store.ParseCursor(q.Get("nextToken"))
	if err != nil {
		return edge.Errorf(http.StatusBadRequest, "Invalid next token")
	}
	sandboxID := ""
	if s := q.Get("sandboxID"); s != "" {
		sandboxID = envd.SandboxID(s)
	}
	var name, tag string
	if s := q.Get("name"); s != "" {
		n, t, hasTag := strings.Cut(s, ":")
		if hasTag {
			ref, err := templatespec.ParseRef(s)
			if err != nil {
				return edge.Errorf(http.StatusBadRequest, "Invalid name: %s", errdefs.Message(err, "not a snapshot name"))
			}
			n, t = ref.Name, ref.Tag
		}
		name, tag = n, t
	}
	list, err := a.opts.Custom.Snapshots(r.Context(), c.AccountID, sandboxID)
	if err != nil {
		return err
	}
	var page []store.Template
	for _, t := range list {
		if (name != "" && t.Name != name) || (tag != "" && t.Tag != tag) {
			continue
		}
		if !after.IsZero() && !before(t, after) {
			continue
		}
		page = append(page, t)
	}
	if len(page) > limit {
		page = page[:limit]
		last := page[limit-1]
		w.Header().Set("X-Next-Token", store.Cursor{CreatedAt: last.CreatedAt, ID: last.ID}.String())
	}
	for _, t := range page {
		out = append(out, snapshotOf(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// before reports whether t comes after cursor c in a newest-first list.
func before(t store.Template, c store.Cursor) bool {
	if !t.CreatedAt.Equal(c.CreatedAt) {
		return t.CreatedAt.Before(c.CreatedAt)
	}
	return t.ID < c.ID
}

// deleteTemplate is DELETE /templates/{templateID} (the SDK's
// deleteSnapshot; E2B's CLI deletes templates with it): the account's
// template or snapshot named by its id, its name:tag, or its name (every
// tag); 204, 404 when there is none, 409 while a sandbox runs it.
func (a *API) deleteTemplate(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	ref := pathParam(r, "templateID")
	notFound := edge.Errorf(http.StatusNotFound, "template '%s' not found", ref)
	if a.opts.Custom == nil {
		return notFound
	}
	list, err := a.opts.Custom.List(r.Context(), c.Principal)
	if err != nil {
		return err
	}
	name, tag, hasTag := strings.Cut(ref, ":")
	var doomed []store.Template
	for _, t := range list {
		if t.AccountID != c.AccountID {
			continue // public: the operator's
		}
		if t.ID == ref || (t.Name == name && (!hasTag || t.Tag == tag)) {
			doomed = append(doomed, t)
		}
	}
	if len(doomed) == 0 {
		return notFound
	}
	for _, t := range doomed {
		if err := a.opts.Custom.Delete(r.Context(), c.Principal, t.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
