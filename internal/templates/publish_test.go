package templates_test

import (
	"errors"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestPublish: the operator publishes alice's ready template; bob finds it
// by its public name and starts from the same image, alice's deletion of
// hers leaves it (and the cached image) in place, and only a ready
// template of an account is published, once per public name.
func TestPublish(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	ref := f.push(t, "apps/pub:v1", v1.Config{Env: []string{"PATH=/bin"}}, map[string]string{"hello": "hi"})
	tpl, err := f.svc.Build(ctx, f.alice, templates.BuildRequest{Name: "tools:1", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	wantClass(t, "publish while building", publishErr(t, f, tpl.ID, ""), errdefs.ErrConflict, "only a ready template")
	if err := f.svc.Run(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	pub, err := templates.Publish(ctx, f.st, tpl.ID, "tools:stable")
	if err != nil {
		t.Fatal(err)
	}
	if pub.AccountID != "" || pub.Status != store.TemplateReady || pub.ID == tpl.ID {
		t.Fatalf("published %+v", pub)
	}
	wantClass(t, "publish twice", publishErr(t, f, tpl.ID, "tools:stable"), errdefs.ErrConflict, "exists")
	wantClass(t, "publish a public one", publishErr(t, f, pub.ID, "x"), errdefs.ErrInvalid, "public already")
	wantClass(t, "publish a missing one", publishErr(t, f, "tpl_nope", ""), errdefs.ErrNotFound, "not found")

	if err := f.svc.Delete(ctx, f.alice, tpl.ID); err != nil {
		t.Fatal(err)
	}
	img, err := f.svc.Find(ctx, f.bob.AccountID, "tools:stable")
	if err != nil {
		t.Fatalf("bob finds the public template after alice deleted hers: %v", err)
	}
	if img.TemplateID != pub.ID {
		t.Fatalf("bob's image is of %s, want %s", img.TemplateID, pub.ID)
	}
	wantClass(t, "bob deletes it", f.svc.Delete(ctx, f.bob, pub.ID), errdefs.ErrForbidden, "operator's")

	if _, err := templates.Unpublish(ctx, f.st, "tools:stable"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Find(ctx, f.bob.AccountID, "tools:stable"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after unpublish: %v", err)
	}
	_, err = templates.Unpublish(ctx, f.st, "tools:stable")
	wantClass(t, "unpublish twice", err, errdefs.ErrNotFound, "no public template")
}

func publishErr(t *testing.T, f *fixture, id, name string) error {
	_, err := templates.Publish(t.Context(), f.st, id, name)
	return err
}
