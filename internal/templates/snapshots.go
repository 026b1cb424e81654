package templates

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// A named snapshot is a sandbox's files saved under a name of its account
// (docs/TEMPLATES.md, "Named snapshots"). It is stored as a template of
// kind snapshot: the same capture as a template saved from a sandbox
// (saveSandbox), the same rows, layers and garbage collection, so that a
// sandbox starts from one on any node as from a template, any number of
// times. What sets it apart is its life: saving a snapshot under a name
// it has replaces it (the name moves to the new one; the old one stays
// for the sandboxes that run it, then is collected, as a build whose tag
// moved), and a name is given when none is (its id). The lists of
// templates leave snapshots out; PromoteSnapshot makes a template of one.
// This is E2B's model too: a snapshot there is a template whose source is
// a sandbox.

// Snapshot saves running sandbox sandboxID's files as named snapshot
// name ("name[:tag]", or "" to name it by its id) of the sandbox's
// account and answers it ready. A snapshot of that name and tag is
// replaced; a template of that name and tag is a conflict.
func (s *Service) Snapshot(ctx context.Context, p auth.Principal, sandboxID, name string) (store.Template, error) {
	id := store.NewID("tpl_")
	ref := templatespec.Ref{Name: id, Tag: templatespec.DefaultTag}
	if name != "" {
		var err error
		if ref, err = templatespec.ParseRef(name); err != nil {
			return store.Template{}, err
		}
	}
	// Saved untagged, then given the tag in one transaction: a snapshot
	// that fails leaves the one it would replace as it was.
	t, err := s.saveSandbox(ctx, p, sandboxID, store.Template{ID: id, Name: ref.Name, Tag: ref.Tag, Kind: store.TemplateKindSnapshot})
	if err != nil {
		return store.Template{}, err
	}
	held, moved, err := s.st.TagTemplate(context.WithoutCancel(ctx), t.ID, ref.Tag)
	if errors.Is(err, store.ErrConflict) {
		// A template took the name during the capture; the untagged
		// snapshot is collected as any stray.
		return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "%s:%s is a template of the account, not a snapshot; choose another name", ref.Name, ref.Tag)
	}
	if err != nil {
		return store.Template{}, fmt.Errorf("name snapshot %s:%s: %w", ref.Name, ref.Tag, err)
	}
	if moved.ID != "" {
		s.log.Info("templates: snapshot replaced", "name", ref.Name, "tag", ref.Tag, "old", moved.ID, "new", held.ID)
		s.CollectStrays(context.WithoutCancel(ctx))
	}
	if err := s.st.RecordEvent(context.WithoutCancel(ctx), SavedFrom(held), store.EventSnapshot,
		map[string]any{"snapshot_id": held.ID, "ref": held.Name + ":" + held.Tag}); err != nil {
		s.log.Warn("templates: record a snapshot's event", "snapshot_id", held.ID, "err", err)
	}
	return held, nil
}

// The reads and changes below act on account accountID's snapshots: the
// caller has applied the one access rule to it (the front ends' actFor).

// Snapshots lists the named snapshots of account accountID, newest first;
// of sandbox sandboxID only, when it is not "".
func (s *Service) Snapshots(ctx context.Context, accountID, sandboxID string) ([]store.Template, error) {
	list, err := s.st.ListTemplates(ctx, accountID)
	if err != nil {
		return nil, err
	}
	out := list[:0:0]
	for _, t := range list {
		if t.IsSnapshot() && t.AccountID == accountID && (sandboxID == "" || SavedFrom(t) == sandboxID) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b store.Template) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out, nil
}

// GetSnapshot finds named snapshot ref of account accountID: its id, or
// its name[:tag]. Another account's, a template, or none is not found.
func (s *Service) GetSnapshot(ctx context.Context, accountID, ref string) (store.Template, error) {
	notFound := errdefs.Newf(errdefs.ErrNotFound, "snapshot %q not found", ref)
	var t store.Template
	var err error
	if strings.HasPrefix(ref, "tpl_") && !strings.Contains(ref, ":") {
		t, err = s.st.GetTemplate(ctx, ref)
		if err == nil && t.Untagged() {
			err = store.ErrNotFound // replaced: kept only for its sandboxes
		}
	}
	if t.ID == "" && (err == nil || errors.Is(err, store.ErrNotFound)) {
		r, perr := templatespec.ParseRef(ref)
		if perr != nil {
			return store.Template{}, perr
		}
		t, err = s.st.FindTemplate(ctx, accountID, r.Name, r.Tag)
	}
	if errors.Is(err, store.ErrNotFound) {
		return store.Template{}, notFound
	}
	if err != nil {
		return store.Template{}, err
	}
	if !t.IsSnapshot() || t.AccountID != accountID {
		return store.Template{}, notFound
	}
	return t, nil
}

// DeleteSnapshot deletes named snapshot ref of account accountID
// (GetSnapshot) and answers it as it was: 409 while a live sandbox started
// from it. Its layer goes when nothing else names it.
func (s *Service) DeleteSnapshot(ctx context.Context, accountID, ref string) (store.Template, error) {
	t, err := s.GetSnapshot(ctx, accountID, ref)
	if err != nil {
		return t, err
	}
	inUse, err := s.st.DeleteTemplate(ctx, t.ID)
	switch {
	case errors.Is(err, store.ErrConflict):
		return t, errdefs.Newf(errdefs.ErrConflict, "snapshot %s:%s is in use by running or paused sandboxes; stop them first", t.Name, t.Tag)
	case errors.Is(err, store.ErrNotFound):
		return t, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q not found", ref)
	case err != nil:
		return t, err
	}
	s.collect(ctx, t, inUse)
	return t, nil
}

// PromoteSnapshot makes template name ("name[:tag]") of account
// accountID from its named snapshot ref: a template with the snapshot's files, base, config
// and start and ready commands, which stays when the snapshot is replaced
// or deleted. A template or snapshot of that name and tag is a conflict.
func (s *Service) PromoteSnapshot(ctx context.Context, accountID, ref, name string) (store.Template, error) {
	if name == "" {
		return store.Template{}, errdefs.New(errdefs.ErrInvalid, "name: required")
	}
	r, err := templatespec.ParseRef(name)
	if err != nil {
		return store.Template{}, err
	}
	snap, err := s.GetSnapshot(ctx, accountID, ref)
	if err != nil {
		return store.Template{}, err
	}
	t := snap
	t.ID, t.Name, t.Tag, t.Kind, t.BuildID, t.NodeID = "", r.Name, r.Tag, "", "", s.cfg.NodeID
	t.CreatedAt, t.UpdatedAt = s.cfg.Now(), s.cfg.Now()
	t.Log = logLine("made from snapshot %s:%s (%s)", snap.Name, snap.Tag, snap.ID)
	if err := s.st.CreateTemplate(ctx, &t); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "template %s:%s exists; delete it first or choose another tag", r.Name, r.Tag)
		}
		return store.Template{}, fmt.Errorf("record template: %w", err)
	}
	return t, nil
}

// SavedFrom is the sandbox a template or snapshot was saved from ("" for
// one built otherwise).
func SavedFrom(t store.Template) string {
	id, ok := strings.CutPrefix(t.Source, "sandbox:")
	if !ok {
		return ""
	}
	return id
}
