package e2b

import (
	"context"
	"net/http"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// CustomTemplates lists the templates a caller may start besides the
// built-in ones (package templates' Service): its account's, then the
// public ones, each with its status; and builds them (the Template API,
// templatebuild.go).
type CustomTemplates interface {
	List(ctx context.Context, p auth.Principal) ([]store.Template, error)
	Get(ctx context.Context, p auth.Principal, id string) (store.Template, error)
	Build(ctx context.Context, p auth.Principal, req templates.BuildRequest) (store.Template, error)
	// Request, Start, AssignTags and RemoveTags are the Template API's
	// builds and tags (package templates' tags.go).
	Request(ctx context.Context, p auth.Principal, spec templates.RequestSpec) (store.Template, error)
	Start(ctx context.Context, p auth.Principal, id string, req templates.BuildRequest) (store.Template, error)
	AssignTags(ctx context.Context, p auth.Principal, target string, tags []string) (store.Template, error)
	RemoveTags(ctx context.Context, p auth.Principal, name string, tags []string) error
	// Delete deletes the account's template (or snapshot) id.
	Delete(ctx context.Context, p auth.Principal, id string) error
	// Snapshot and Snapshots are the named snapshots (snapshots.go).
	Snapshot(ctx context.Context, p auth.Principal, sandboxID, name string) (store.Template, error)
	Snapshots(ctx context.Context, accountID, sandboxID string) ([]store.Template, error)
}

// template is the part of E2B's Template the SDKs and its CLI read when
// listing.
type template struct {
	TemplateID  string     `json:"templateID"`
	BuildID     string     `json:"buildID"`
	Aliases     []string   `json:"aliases"`
	Names       []string   `json:"names"`
	Public      bool       `json:"public"`
	BuildStatus string     `json:"buildStatus"`
	CPUCount    int        `json:"cpuCount"`
	MemoryMB    int        `json:"memoryMB"`
	DiskSizeMB  int        `json:"diskSizeMB"`
	EnvdVer     string     `json:"envdVersion"`
	CreatedAt   *time.Time `json:"createdAt,omitempty"`
	UpdatedAt   *time.Time `json:"updatedAt,omitempty"`
	BuildCount  int        `json:"buildCount"`
	SpawnCount  int        `json:"spawnCount"`
}

// templates is GET /templates: the built-in ids (all the server's image),
// then the caller's custom templates and the public ones in E2B's shape:
// the template's id as templateID, NAME:TAG (and NAME alone for the tag
// latest) as its aliases, and its status as E2B's buildStatus (building,
// ready, error).
func (a *API) templates(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	out := []template{}
	for _, id := range append([]string{DefaultTemplate}, a.opts.Templates...) {
		out = append(out, template{TemplateID: id, BuildID: id, Aliases: []string{id}, Names: []string{id}, Public: true, BuildStatus: "ready",
			CPUCount: a.opts.CPUs, MemoryMB: a.opts.MemoryMB, DiskSizeMB: a.opts.DiskMB, EnvdVer: EnvdVersion, BuildCount: 1})
	}
	if a.opts.Custom != nil {
		list, err := a.opts.Custom.List(r.Context(), c.Principal)
		if err != nil {
			return err
		}
		for _, t := range list {
			if t.IsSnapshot() {
				continue // GET /snapshots lists them, as E2B's lists do
			}
			ref := t.Name + ":" + t.Tag
			aliases := []string{ref}
			if t.Tag == templatespec.DefaultTag {
				aliases = append(aliases, t.Name)
			}
			status := string(t.Status)
			switch {
			case t.Status == store.TemplateFailed:
				status = "error"
			case t.Waiting():
				status = "waiting"
			}
			created, updated := t.CreatedAt, t.UpdatedAt
			out = append(out, template{TemplateID: t.ID, BuildID: t.ID, Aliases: aliases, Names: []string{ref}, Public: t.AccountID == "", BuildStatus: status,
				CPUCount: a.opts.CPUs, MemoryMB: a.opts.MemoryMB, DiskSizeMB: a.opts.DiskMB, EnvdVer: EnvdVersion,
				CreatedAt: &created, UpdatedAt: &updated, BuildCount: 1})
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// customTemplate is the custom template a create's templateID names, as
// "name:tag" for the sandbox manager (sandbox.CreateRequest.Template), or
// "" when it names none, for the built-in ids. templateID is a template's
// id or "name[:tag]", the account's own before a public one of that name
// and tag, as the manager resolves it. Its status is left to the manager,
// which refuses one building or failed (409) as the REST create does.
func (a *API) customTemplate(ctx context.Context, c edge.Caller, templateID string) (string, error) {
	if a.opts.Custom == nil {
		return "", nil
	}
	list, err := a.opts.Custom.List(ctx, c.Principal)
	if err != nil {
		return "", err
	}
	byName := func(name, tag string) (store.Template, bool) {
		var public *store.Template
		for i, t := range list {
			if t.Name != name || t.Tag != tag {
				continue
			}
			if t.AccountID != "" {
				return t, true
			}
			if public == nil {
				public = &list[i]
			}
		}
		if public != nil {
			return *public, true
		}
		return store.Template{}, false
	}
	for _, t := range list {
		if t.ID != templateID {
			continue
		}
		// The manager starts a template by its name: a public one
		// whose name the account's own template also has cannot be
		// started by its id.
		if first, _ := byName(t.Name, t.Tag); first.ID != t.ID {
			return "", edge.Errorf(http.StatusConflict, "template %q is a public template named %s:%s, as is the account's own template %s, which that name starts; rename or delete the account's to start this one", templateID, t.Name, t.Tag, first.ID)
		}
		return t.Name + ":" + t.Tag, nil
	}
	ref, err := templatespec.ParseRef(templateID)
	if err != nil {
		// Not a template name: perhaps a built-in id.
		return "", nil
	}
	if t, ok := byName(ref.Name, ref.Tag); ok {
		return t.Name + ":" + t.Tag, nil
	}
	return "", nil
}
