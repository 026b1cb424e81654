package e2b

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
	"github.com/sandboxd/sandboxd/internal/templatespec"
)

// storeTemplates lists templates as package templates' Service does.
type storeTemplates struct{ st *store.Store }

func (s storeTemplates) List(ctx context.Context, p auth.Principal) ([]store.Template, error) {
	return s.st.ListTemplates(ctx, p.AccountID)
}

// Build records the template building, with its request as its source
// and definition (the service's validation is its own tests').
func (s storeTemplates) Build(ctx context.Context, p auth.Principal, req templates.BuildRequest) (store.Template, error) {
	ref, err := templatespec.ParseRef(req.Name)
	if err != nil {
		return store.Template{}, err
	}
	source := req.Image
	if req.FromTemplate != "" {
		source = "template:" + req.FromTemplate
	}
	t := store.Template{AccountID: p.AccountID, Name: ref.Name, Tag: ref.Tag, Source: source, Status: store.TemplateBuilding,
		Definition: string(req.Steps) + "\n" + req.StartCmd + "\n" + req.ReadyCmd, Log: "2026-01-02T03:04:05Z build of " + req.Name + " queued\n"}
	if err := s.st.CreateTemplate(ctx, &t); err != nil {
		if errors.Is(err, store.ErrConflict) {
			return store.Template{}, errdefs.Newf(errdefs.ErrConflict, "template %s exists", req.Name)
		}
		return store.Template{}, err
	}
	return t, nil
}

func (s storeTemplates) Get(ctx context.Context, p auth.Principal, id string) (store.Template, error) {
	t, err := s.st.GetTemplate(ctx, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && t.AccountID != "" && t.AccountID != p.AccountID) {
		return store.Template{}, errdefs.New(errdefs.ErrNotFound, "Template not found")
	}
	return t, err
}

// Request records the build waiting, in its name:tag's place when free.
func (s storeTemplates) Request(ctx context.Context, p auth.Principal, spec templates.RequestSpec) (store.Template, error) {
	ref, err := templatespec.ParseRef(spec.Name)
	if err != nil {
		return store.Template{}, err
	}
	t := store.Template{ID: store.NewID("tpl_"), AccountID: p.AccountID, Name: ref.Name, Tag: ref.Tag, Status: store.TemplateBuilding,
		Definition: strings.Join(append([]string{ref.Tag}, spec.Tags...), ","), Log: "2026-01-02T03:04:05Z build of " + spec.Name + " requested\n"}
	err = s.st.CreateTemplate(ctx, &t)
	if errors.Is(err, store.ErrConflict) {
		t.Tag = store.UntaggedTag(t.ID)
		err = s.st.CreateTemplate(ctx, &t)
	}
	return t, err
}

// Start records the request as the waiting build's source and
// definition.
func (s storeTemplates) Start(ctx context.Context, p auth.Principal, id string, req templates.BuildRequest) (store.Template, error) {
	t, err := s.Get(ctx, p, id)
	if err != nil {
		return t, err
	}
	ok, err := s.st.StartTemplate(ctx, id, req.Image, "", string(req.Steps)+"\n"+req.StartCmd+"\n"+req.ReadyCmd, "n1")
	if err == nil && !ok {
		err = errdefs.New(errdefs.ErrConflict, "started already")
	}
	return t, err
}

func (s storeTemplates) AssignTags(ctx context.Context, p auth.Principal, target string, tags []string) (store.Template, error) {
	ref, err := templatespec.ParseRef(target)
	if err != nil {
		return store.Template{}, err
	}
	t, err := s.st.FindTemplate(ctx, p.AccountID, ref.Name, ref.Tag)
	if errors.Is(err, store.ErrNotFound) || (err == nil && t.AccountID != p.AccountID) {
		return store.Template{}, errdefs.New(errdefs.ErrNotFound, "template not found")
	}
	for _, tag := range tags {
		if _, _, err := s.st.TagTemplate(ctx, t.ID, tag); err != nil {
			return store.Template{}, err
		}
	}
	return t, nil
}

func (s storeTemplates) RemoveTags(ctx context.Context, p auth.Principal, name string, tags []string) error {
	for _, tag := range tags {
		if _, err := s.st.UntagTemplate(ctx, p.AccountID, name, tag); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return errdefs.Newf(errdefs.ErrNotFound, "template %s:%s not found", name, tag)
			}
			return err
		}
	}
	return nil
}

func (s storeTemplates) Delete(ctx context.Context, p auth.Principal, id string) error {
	if _, err := s.Get(ctx, p, id); err != nil {
		return err
	}
	_, err := s.st.DeleteTemplate(ctx, id)
	return err
}

// Snapshot records a ready snapshot of sandboxID as the service leaves
// one, without its capture (package templates' tests save real ones), or
// replaces the one of that name.
func (s storeTemplates) Snapshot(ctx context.Context, p auth.Principal, sandboxID, name string) (store.Template, error) {
	id := store.NewID("tpl_")
	ref := templatespec.Ref{Name: id, Tag: templatespec.DefaultTag}
	if name != "" {
		var err error
		if ref, err = templatespec.ParseRef(name); err != nil {
			return store.Template{}, err
		}
	}
	t := store.Template{ID: id, AccountID: p.AccountID, Name: ref.Name, Tag: store.UntaggedTag(id), Status: store.TemplateReady, Source: "sandbox:" + sandboxID,
		Kind: store.TemplateKindSnapshot, Config: "{}"}
	if err := s.st.CreateTemplate(ctx, &t); err != nil {
		return t, err
	}
	held, _, err := s.st.TagTemplate(ctx, id, ref.Tag)
	return held, err
}

func (s storeTemplates) Snapshots(ctx context.Context, accountID, sandboxID string) ([]store.Template, error) {
	list, err := s.st.ListTemplates(ctx, accountID)
	var out []store.Template
	for _, t := range list {
		if t.IsSnapshot() && t.AccountID == accountID && (sandboxID == "" || t.Source == "sandbox:"+sandboxID) {
			out = append(out, t)
		}
	}
	// Newest first, as the service answers.
	slices.SortFunc(out, func(a, b store.Template) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	return out, err
}

// templateFixture is a fixture whose store has alice's templates py
// (ready), py:3.12 (building), broken (failed) and base (ready, which
// shadows the built-in id), a public py (ready, shadowed by alice's) and
// a public tools:1, and bob's secret.
func templateFixture(t *testing.T) (*fixture, map[string]string) {
	f := newFixture(t, func(o *fixtureOptions) { o.Custom = storeTemplates{o.Store.(*store.Store)} })
	accounts, err := f.st.ListAccounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{}
	for _, a := range accounts {
		id[a.Name] = a.ID
	}
	ids := map[string]string{}
	for _, c := range []struct {
		owner string // "" for public
		tpl   store.Template
	}{
		{"alice", store.Template{Name: "py", Tag: "latest", Status: store.TemplateReady}},
		{"alice", store.Template{Name: "py", Tag: "3.12", Status: store.TemplateBuilding}},
		{"alice", store.Template{Name: "broken", Tag: "latest", Status: store.TemplateFailed, FailureReason: "image not found"}},
		{"alice", store.Template{Name: "base", Tag: "latest", Status: store.TemplateReady}},
		{"", store.Template{Name: "py", Tag: "latest", Status: store.TemplateReady}},
		{"", store.Template{Name: "tools", Tag: "1", Status: store.TemplateReady}},
		{"bob", store.Template{Name: "secret", Tag: "latest", Status: store.TemplateReady}},
	} {
		tpl := c.tpl
		tpl.AccountID, tpl.Source = id[c.owner], "registry.example/"+tpl.Name
		if err := f.st.CreateTemplate(t.Context(), &tpl); err != nil {
			t.Fatal(err)
		}
		owner := c.owner
		if owner == "" {
			owner = "public"
		}
		ids[owner+"/"+tpl.Name+":"+tpl.Tag] = tpl.ID
	}
	return f, ids
}

// TestCreateFromCustomTemplate: a create's templateID names the account's
// template (by name, name:tag or id) before a public one and before the
// built-in ids; one building or failed is E2B's error with the REST
// create's status; another account's is not found.
func TestCreateFromCustomTemplate(t *testing.T) {
	f, ids := templateFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	for _, c := range []struct {
		templateID, want string
	}{
		{"py", "py:latest"},
		{"py:latest", "py:latest"},
		{ids["alice/py:latest"], "py:latest"},
		{"tools:1", "tools:1"},
		{ids["public/tools:1"], "tools:1"},
		{"base", "base:latest"}, // the account's own before the built-in id
		{"", "base:latest"},     // E2B's default is base
	} {
		var sb sandboxResponse
		body := map[string]any{}
		if c.templateID != "" {
			body["templateID"] = c.templateID
		}
		if resp := f.call("POST", "/v2/sandboxes", key, body, &sb); resp.StatusCode != http.StatusCreated {
			t.Errorf("create %q: %d", c.templateID, resp.StatusCode)
			continue
		}
		if f.sbs.last.Template != c.want {
			t.Errorf("create %q: started template %q, want %q", c.templateID, f.sbs.last.Template, c.want)
		}
		if want := c.templateID; want != "" && sb.TemplateID != want {
			t.Errorf("create %q: answered templateID %q", c.templateID, sb.TemplateID)
		}
	}
	for _, c := range []struct {
		templateID string
		code       int
		msg        string
	}{
		{"py:3.12", http.StatusConflict, "still building"},
		{"broken", http.StatusConflict, "failed to build: image not found"},
		{"secret", http.StatusNotFound, "not found"},
		{ids["bob/secret:latest"], http.StatusNotFound, "not found"},
		{ids["public/py:latest"], http.StatusConflict, "the account's own template"},
		{"nope", http.StatusNotFound, "GET /templates"},
	} {
		var e envd.Error
		if resp := f.call("POST", "/sandboxes", key, map[string]any{"templateID": c.templateID}, &e); resp.StatusCode != c.code || e.Code != c.code || !strings.Contains(e.Message, c.msg) {
			t.Errorf("create %q: %d %+v, want %d with %q", c.templateID, resp.StatusCode, e, c.code, c.msg)
		}
	}

	// Bob has no base of his own: the built-in id, the server's image.
	if f.create(f.otherKey, map[string]any{"templateID": "base"}); f.sbs.last.Template != "" {
		t.Errorf("bob's base started template %q, want the built-in image", f.sbs.last.Template)
	}
}

// TestListCustomTemplates: GET /templates lists the built-in ids, then the
// account's templates and the public ones in E2B's shape; never another
// account's.
func TestListCustomTemplates(t *testing.T) {
	f, ids := templateFixture(t)
	var list []template
	if resp := f.call("GET", "/templates", map[string]string{"X-API-Key": f.key}, nil, &list); resp.StatusCode != http.StatusOK {
		t.Fatalf("list: %d", resp.StatusCode)
	}
	byID := map[string]template{}
	var order []string
	for _, tpl := range list {
		byID[tpl.TemplateID] = tpl
		order = append(order, tpl.TemplateID)
	}
	if len(list) != 7 || order[0] != DefaultTemplate || byID[DefaultTemplate].BuildStatus != "ready" {
		t.Fatalf("list: %v", order)
	}
	if _, ok := byID[ids["bob/secret:latest"]]; ok {
		t.Error("alice's list has bob's template")
	}
	py := byID[ids["alice/py:latest"]]
	if !slices.Equal(py.Aliases, []string{"py:latest", "py"}) || py.Public || py.BuildStatus != "ready" || py.CreatedAt == nil || py.CPUCount != 2 {
		t.Errorf("py: %+v", py)
	}
	if b := byID[ids["alice/py:3.12"]]; !slices.Equal(b.Aliases, []string{"py:3.12"}) || b.BuildStatus != "building" {
		t.Errorf("py:3.12: %+v", b)
	}
	if b := byID[ids["alice/broken:latest"]]; b.BuildStatus != "error" {
		t.Errorf("broken: %+v", b)
	}
	if p := byID[ids["public/tools:1"]]; !p.Public {
		t.Errorf("tools:1: %+v", p)
	}
}
