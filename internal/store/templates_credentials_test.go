package store_test

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestTemplateCredentials: a build's sealed credentials are kept while it
// builds (replaced by a later put), and go with its end, its template's
// deletion, or the backstop for templates no longer building.
func TestTemplateCredentials(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "alice")
		mk := func(name string) store.Template {
			tp := store.Template{AccountID: alice.ID, Name: name, Tag: "1", Source: "registry.example/" + name}
			if err := s.CreateTemplate(ctx, &tp); err != nil {
				t.Fatal(err)
			}
			if err := s.PutTemplateCredentials(ctx, tp.ID, "v1:first"); err != nil {
				t.Fatal(err)
			}
			return tp
		}
		gone := func(what, id string) {
			t.Helper()
			if _, err := s.GetTemplateCredentials(ctx, id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s: the credentials are still there: %v", what, err)
			}
		}
		ready, failed, deleted, stale, kept := mk("ready"), mk("failed"), mk("deleted"), mk("stale"), mk("kept")
		if err := s.PutTemplateCredentials(ctx, kept.ID, "v1:second"); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetTemplateCredentials(ctx, kept.ID); err != nil || got != "v1:second" {
			t.Fatalf("get: %q %v", got, err)
		}
		wantErr(t, "empty", s.PutTemplateCredentials(ctx, kept.ID, ""), store.ErrInvalid)

		if ok, err := s.FinishTemplate(ctx, ready.ID, store.TemplateReady, "sha256:x", "{}", ""); !ok || err != nil {
			t.Fatal(ok, err)
		}
		gone("ready", ready.ID)
		if ok, err := s.FinishTemplate(ctx, failed.ID, store.TemplateFailed, "", "", "no"); !ok || err != nil {
			t.Fatal(ok, err)
		}
		gone("failed", failed.ID)
		if _, err := s.DeleteTemplate(ctx, deleted.ID); err != nil {
			t.Fatal(err)
		}
		gone("deleted", deleted.ID)

		// A row ended by another way keeps them until the backstop.
		q := "UPDATE templates SET status = 'failed' WHERE id = ?"
		if s.Dialect() == store.DialectPostgres {
			q = "UPDATE templates SET status = 'failed' WHERE id = $1"
		}
		if _, err := s.DB().ExecContext(ctx, q, stale.ID); err != nil {
			t.Fatal(err)
		}
		if n, err := s.DeleteStaleTemplateCredentials(ctx); err != nil || n != 1 {
			t.Fatalf("stale: %d %v", n, err)
		}
		gone("stale", stale.ID)
		if _, err := s.GetTemplateCredentials(ctx, kept.ID); err != nil {
			t.Fatalf("a building template's credentials went: %v", err)
		}
	})
}
