package templates_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestRequestedBuildsAndTags: E2B's builds — requested, then started;
// several tags a build (a row each, one build); a rebuild that waits
// untagged and takes the tag when ready, the old build staying untagged;
// a failed rebuild leaving the tag where it was; tags assigned and
// removed; sizes over the limits refused; another account's build not
// found.
func TestRequestedBuildsAndTags(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	ref := f.push(t, "tools/web:1", v1.Config{Env: []string{"PATH=/bin"}}, map[string]string{"index.html": "one\n"})

	for _, c := range []struct {
		spec  templates.RequestSpec
		words string
	}{
		{templates.RequestSpec{Name: "web", CPUs: 1e6}, "cpuCount"},
		{templates.RequestSpec{Name: "web", CPUs: 0.5}, "cpuCount"},
		{templates.RequestSpec{Name: "web", MemoryMiB: 64}, "memoryMB"},
		{templates.RequestSpec{Name: "web", MemoryMiB: 1 << 40}, "memoryMB"},
		{templates.RequestSpec{Name: "web", Tags: []string{"no spaces"}}, "tags"},
	} {
		_, err := f.svc.Request(ctx, f.alice, c.spec)
		wantClass(t, c.words, err, errdefs.ErrInvalid, c.words)
	}

	first, err := f.svc.Request(ctx, f.alice, templates.RequestSpec{Name: "web:v1", Tags: []string{"stable", "v1"}, CPUs: 1, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if first.Tag != "v1" || !first.Waiting() {
		t.Fatalf("requested %+v", first)
	}
	_, err = f.svc.Start(ctx, f.bob, first.ID, templates.BuildRequest{Image: ref})
	wantClass(t, "bob starts alice's build", err, errdefs.ErrNotFound, "not found")
	if _, err := f.svc.Start(ctx, f.alice, first.ID, templates.BuildRequest{Image: ref}); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Start(ctx, f.alice, first.ID, templates.BuildRequest{Image: ref})
	wantClass(t, "started twice", err, errdefs.ErrConflict, "started already")
	if err := f.svc.Run(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	stable, err := f.st.FindTemplate(ctx, f.alice.AccountID, "web", "stable")
	if err != nil || stable.Build() != first.ID || stable.ID == first.ID || stable.Status != store.TemplateReady {
		t.Fatalf("web:stable %+v %v", stable, err)
	}

	// A rebuild of web:v1 waits untagged; web:v1 starts the first build
	// until the rebuild is ready.
	second, err := f.svc.Request(ctx, f.alice, templates.RequestSpec{Name: "web:v1"})
	if err != nil {
		t.Fatal(err)
	}
	if !second.Untagged() {
		t.Fatalf("rebuild recorded %+v", second)
	}
	list, _ := f.svc.List(ctx, f.alice)
	for _, tpl := range list {
		if tpl.ID == second.ID {
			t.Errorf("the untagged rebuild is listed: %+v", tpl)
		}
	}
	if _, err := f.svc.Start(ctx, f.alice, second.ID, templates.BuildRequest{Image: ref}); err != nil {
		t.Fatal(err)
	}
	if img, err := f.svc.Find(ctx, f.alice.AccountID, "web:v1"); err != nil || img.TemplateID != first.ID {
		t.Fatalf("web:v1 while the rebuild builds: %+v %v", img, err)
	}
	if err := f.svc.Run(ctx, second.ID); err != nil {
		t.Fatal(err)
	}
	if img, err := f.svc.Find(ctx, f.alice.AccountID, "web:v1"); err != nil || img.TemplateID != second.ID {
		t.Fatalf("web:v1 after the rebuild: %+v %v", img, err)
	}
	old, err := f.svc.Get(ctx, f.alice, first.ID)
	if err != nil || !old.Untagged() || old.Status != store.TemplateReady {
		t.Fatalf("the first build after the rebuild: %+v %v", old, err)
	}
	if img, err := f.svc.Find(ctx, f.alice.AccountID, "web:stable"); err != nil || img.TemplateID != stable.ID {
		t.Fatalf("web:stable after the rebuild: %+v %v", img, err)
	}

	// A failed rebuild leaves the tag where it was.
	third, err := f.svc.Request(ctx, f.alice, templates.RequestSpec{Name: "web:v1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Start(ctx, f.alice, third.ID, templates.BuildRequest{Image: f.host + "/tools/missing:1"}); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Run(ctx, third.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.svc.Get(ctx, f.alice, third.ID); got.Status != store.TemplateFailed || !got.Untagged() {
		t.Fatalf("failed rebuild %+v", got)
	}
	if img, err := f.svc.Find(ctx, f.alice.AccountID, "web:v1"); err != nil || img.TemplateID != second.ID {
		t.Fatalf("web:v1 after a failed rebuild: %+v %v", img, err)
	}

	// Tags assigned and removed.
	target, err := f.svc.AssignTags(ctx, f.alice, "web:v1", []string{"prod", "blue"})
	if err != nil || target.ID != second.ID {
		t.Fatalf("assign: %+v %v", target, err)
	}
	prod, err := f.st.FindTemplate(ctx, f.alice.AccountID, "web", "prod")
	if err != nil || prod.Build() != second.ID {
		t.Fatalf("web:prod %+v %v", prod, err)
	}
	_, err = f.svc.AssignTags(ctx, f.bob, "web:v1", []string{"x"})
	wantClass(t, "bob assigns", err, errdefs.ErrNotFound, "not found")
	err = f.svc.RemoveTags(ctx, f.alice, "web", []string{"prod", "nope"})
	wantClass(t, "remove an unknown tag", err, errdefs.ErrNotFound, "web:nope")
	if _, err := f.st.FindTemplate(ctx, f.alice.AccountID, "web", "prod"); err != nil {
		t.Fatalf("web:prod went with a refused removal: %v", err)
	}
	if err := f.svc.RemoveTags(ctx, f.alice, "web", []string{"prod", "blue"}); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Find(ctx, f.alice.AccountID, "web:prod")
	wantClass(t, "web:prod removed", err, errdefs.ErrNotFound, "not found")
	var tags []string
	list, _ = f.svc.List(ctx, f.alice)
	for _, tpl := range list {
		tags = append(tags, tpl.Name+":"+tpl.Tag)
	}
	if strings.Join(tags, " ") != "web:stable web:v1" {
		t.Errorf("listed %v", tags)
	}

	// Collected: the first build (untagged, no sandbox) once settled, the
	// failed rebuild after an hour; never a tagged one.
	svc, err := templates.New(templates.Config{Store: f.st, NodeID: "here", Dir: f.dir, Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	svc.CollectStrays(ctx)
	for _, id := range []string{first.ID, third.ID} {
		if _, err := f.st.GetTemplate(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s not collected: %v", id, err)
		}
	}
	for _, id := range []string{second.ID, stable.ID} {
		if _, err := f.st.GetTemplate(ctx, id); err != nil {
			t.Errorf("%s collected: %v", id, err)
		}
	}
}
