package templates

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// Publish makes ready template id (an account's) public under name
// ("name[:tag]"; "" keeps its own): a copy owned by the operator (account
// ""), which every account sees and starts from and none changes through
// the API. The copy names the same digest, config, definition and layer
// chain, so the cached image and the layers' blobs stay while either row
// does, and it does not change when the account's template is deleted or
// rebuilt. It is the operator's (sandboxd admin), not an API route: an
// account cannot publish into every other account's namespace.
func Publish(ctx context.Context, st *store.Store, id, name string) (store.Template, error) {
	t, err := st.GetTemplate(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Template{}, errdefs.Newf(errdefs.ErrNotFound, "template %s not found", id)
	}
	if err != nil {
		return store.Template{}, err
	}
	switch {
	case t.AccountID == "":
		return store.Template{}, errdefs.Newf(errdefs.ErrInvalid, "template %s:%s is public already", t.Name, t.Tag)
	case t.Status != store.TemplateReady:
		return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "template %s:%s is %s: only a ready template is published", t.Name, t.Tag, t.Status)
	}
	ref := templatespec.Ref{Name: t.Name, Tag: t.Tag}
	if name != "" {
		if ref, err = templatespec.ParseRef(name); err != nil {
			return store.Template{}, err
		}
	}
	pub := store.Template{
		Name: ref.Name, Tag: ref.Tag, Status: store.TemplateReady, Source: t.Source, Digest: t.Digest, Config: t.Config,
		NodeID: t.NodeID, Definition: t.Definition, Layers: t.Layers,
		Log: logLine("published by the operator from template %s (%s:%s of account %s)", t.ID, t.Name, t.Tag, t.AccountID),
	}
	if err := st.CreateTemplate(ctx, &pub); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "a public template %s exists; unpublish it first or choose another tag", ref)
		}
		return store.Template{}, fmt.Errorf("publish template %s: %w", id, err)
	}
	return pub, nil
}

// Unpublish deletes public template name ("name[:tag]"); refused (409)
// while a live sandbox started from it. The cached image and the layers
// stay while another template names them.
func Unpublish(ctx context.Context, st *store.Store, name string) (store.Template, error) {
	ref, err := templatespec.ParseRef(name)
	if err != nil {
		return store.Template{}, err
	}
	t, err := st.FindTemplate(ctx, "", ref.Name, ref.Tag)
	if err == nil && t.AccountID != "" {
		err = store.ErrNotFound
	}
	if errors.Is(err, store.ErrNotFound) {
		return store.Template{}, errdefs.Newf(errdefs.ErrNotFound, "no public template %s", ref)
	}
	if err != nil {
		return store.Template{}, err
	}
	if _, err := st.DeleteTemplate(ctx, t.ID); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "public template %s is in use by running or paused sandboxes; stop them first", ref)
		}
		return store.Template{}, err
	}
	return t, nil
}
