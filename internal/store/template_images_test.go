package store_test

import (
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestTemplateImages(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "alice")
		const digest = "sha256:aa"
		_, err := s.GetTemplateImage(ctx, digest)
		wantErr(t, "absent", err, store.ErrNotFound)
		if err := s.PutTemplateImage(ctx, store.TemplateImage{Digest: digest, BlobKey: "b1", Size: 1, Bytes: 2, Entries: 3}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutTemplateImage(ctx, store.TemplateImage{Digest: digest, BlobKey: "b2", Size: 4, Bytes: 5, Entries: 6}); err != nil {
			t.Fatal(err)
		}
		img, err := s.GetTemplateImage(ctx, digest)
		if err != nil || img.BlobKey != "b2" || img.Size != 4 || img.Bytes != 5 || img.Entries != 6 || img.CreatedAt.IsZero() {
			t.Fatalf("got %+v %v", img, err)
		}
		if list, err := s.ListTemplateImages(ctx); err != nil || len(list) != 1 || list[0].BlobKey != "b2" {
			t.Fatalf("list %+v %v", list, err)
		}

		// Named by a template (building: its digest set before the
		// fetch): kept.
		tpl := store.Template{AccountID: alice.ID, Name: "py", Tag: "1", Source: "registry.example/py"}
		if err := s.CreateTemplate(ctx, &tpl); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.SetTemplateDigest(ctx, tpl.ID, digest); !ok || err != nil {
			t.Fatalf("set digest: %v %v", ok, err)
		}
		if n, err := s.CountTemplatesWithDigest(ctx, digest); n != 1 || err != nil {
			t.Fatalf("count %d %v", n, err)
		}
		if _, deleted, err := s.DeleteUnusedTemplateImage(ctx, digest); deleted || err != nil {
			t.Fatalf("deleted while named: %v %v", deleted, err)
		}
		if inUse, err := s.TemplateBlobInUse(ctx, "b2"); !inUse || err != nil {
			t.Fatalf("the image's blob in use: %v %v", inUse, err)
		}
		if _, err := s.FinishTemplate(ctx, tpl.ID, store.TemplateFailed, "", "", "no"); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.SetTemplateDigest(ctx, tpl.ID, digest); ok {
			t.Fatal("set the digest of a finished template")
		}
		got, deleted, err := s.DeleteUnusedTemplateImage(ctx, digest)
		if !deleted || err != nil || got.BlobKey != "b2" {
			t.Fatalf("delete unused: %+v %v %v", got, deleted, err)
		}
		if _, deleted, err := s.DeleteUnusedTemplateImage(ctx, digest); deleted || err != nil {
			t.Fatalf("delete again: %v %v", deleted, err)
		}
		if inUse, err := s.TemplateBlobInUse(ctx, "b2"); inUse || err != nil {
			t.Fatalf("unnamed blob in use: %v %v", inUse, err)
		}

		// Layers: named by a chain or by the build cache.
		if ok, err := s.SetTemplateLayers(ctx, tpl.ID, `["c1"]`); ok || err != nil {
			t.Fatalf("layers of a failed template: %v %v", ok, err)
		}
		other := store.Template{AccountID: alice.ID, Name: "py", Tag: "2", Source: "registry.example/py", Layers: `["c1","c2"]`}
		if err := s.CreateTemplate(ctx, &other); err != nil {
			t.Fatal(err)
		}
		if err := s.PutTemplateLayer(ctx, store.TemplateLayer{AccountID: alice.ID, CacheKey: "k", BlobKey: "c3", Size: 1}); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]bool{"c1": true, "c2": true, "c3": true, "c": false, "c4": false} {
			if inUse, err := s.TemplateBlobInUse(ctx, key); inUse != want || err != nil {
				t.Errorf("%s in use: %v %v, want %v", key, inUse, err, want)
			}
		}
	})
}

func TestTemplateLayersCollected(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "alice")
		old := time.Now().Add(-time.Hour)
		for _, l := range []store.TemplateLayer{
			{AccountID: alice.ID, CacheKey: "named", BlobKey: "b1", Size: 1, CreatedAt: old},
			{AccountID: alice.ID, CacheKey: "unnamed", BlobKey: "b2", Size: 1, CreatedAt: old},
			{AccountID: alice.ID, CacheKey: "taken", BlobKey: "b3", Size: 1, CreatedAt: old},
			{AccountID: alice.ID, CacheKey: "new", BlobKey: "b4", Size: 1},
		} {
			if err := s.PutTemplateLayer(ctx, l); err != nil {
				t.Fatal(err)
			}
		}
		tpl := store.Template{AccountID: alice.ID, Name: "py", Tag: "1", Source: "registry.example/py", Layers: `["b0","b1"]`}
		if err := s.CreateTemplate(ctx, &tpl); err != nil {
			t.Fatal(err)
		}
		if l, err := s.UseTemplateLayer(ctx, alice.ID, "taken"); err != nil || l.BlobKey != "b3" {
			t.Fatalf("use: %+v %v", l, err)
		}
		_, err := s.UseTemplateLayer(ctx, alice.ID, "absent")
		wantErr(t, "use an absent entry", err, store.ErrNotFound)
		gone, err := s.DeleteUnusedTemplateLayers(ctx, time.Now().Add(-time.Minute))
		if err != nil || len(gone) != 1 || gone[0].CacheKey != "unnamed" || gone[0].BlobKey != "b2" {
			t.Fatalf("collected %+v %v", gone, err)
		}
		for _, k := range []string{"named", "taken", "new"} {
			if _, err := s.GetTemplateLayer(ctx, alice.ID, k); err != nil {
				t.Errorf("%s: %v", k, err)
			}
		}
	})
}
