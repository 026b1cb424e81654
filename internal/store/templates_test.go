package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestTemplates(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "alice")
		bob := mustAccount(t, s, store.AccountPersonal, "bob")

		mine := store.Template{AccountID: alice.ID, Name: "py", Tag: "latest", Source: "registry.example/py:3"}
		if err := s.CreateTemplate(ctx, &mine); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(mine.ID, "tpl_") || mine.Status != store.TemplateBuilding {
			t.Fatalf("created %+v", mine)
		}
		dup := store.Template{AccountID: alice.ID, Name: "py", Tag: "latest", Source: "x"}
		wantErr(t, "same name and tag", s.CreateTemplate(ctx, &dup), store.ErrConflict)
		// The same name and tag in another account, and public, are others.
		pub := store.Template{Name: "py", Tag: "latest", Source: "registry.example/py:3"}
		if err := s.CreateTemplate(ctx, &pub); err != nil {
			t.Fatal(err)
		}
		other := store.Template{AccountID: bob.ID, Name: "node", Tag: "v1", Source: "registry.example/node", NodeID: "n1"}
		if err := s.CreateTemplate(ctx, &other); err != nil {
			t.Fatal(err)
		}

		// Find: the account's own first, then the public one.
		got, err := s.FindTemplate(ctx, alice.ID, "py", "latest")
		if err != nil || got.ID != mine.ID {
			t.Fatalf("find own: %+v %v", got, err)
		}
		got, err = s.FindTemplate(ctx, bob.ID, "py", "latest")
		if err != nil || got.ID != pub.ID {
			t.Fatalf("find public: %+v %v", got, err)
		}
		_, err = s.FindTemplate(ctx, alice.ID, "node", "v1")
		wantErr(t, "another account's", err, store.ErrNotFound)

		list, err := s.ListTemplates(ctx, alice.ID)
		if err != nil || len(list) != 2 || list[0].ID != mine.ID || list[1].ID != pub.ID {
			t.Fatalf("list: %+v %v", list, err)
		}

		// The log keeps its tail, from a line's start.
		line := strings.Repeat("x", 1000) + "\n"
		for range 70 {
			if err := s.AppendTemplateLog(ctx, mine.ID, line); err != nil {
				t.Fatal(err)
			}
		}
		got, _ = s.GetTemplate(ctx, mine.ID)
		if len(got.Log) > store.MaxTemplateLog || len(got.Log)%len(line) != 0 || len(got.Log) < store.MaxTemplateLog-len(line) {
			t.Fatalf("log of %d bytes", len(got.Log))
		}
		wantErr(t, "log of a template that is gone", s.AppendTemplateLog(ctx, "tpl_gone", "x"), store.ErrNotFound)

		// Finish: once, from building.
		ok, err := s.FinishTemplate(ctx, mine.ID, store.TemplateReady, "sha256:aa", `{"Env":["A=b"]}`, "")
		if err != nil || !ok {
			t.Fatalf("finish: %v %v", ok, err)
		}
		if ok, _ := s.FinishTemplate(ctx, mine.ID, store.TemplateFailed, "", "", "late"); ok {
			t.Fatal("finished twice")
		}
		got, _ = s.GetTemplate(ctx, mine.ID)
		if got.Status != store.TemplateReady || got.Digest != "sha256:aa" || got.Config != `{"Env":["A=b"]}` {
			t.Fatalf("ready: %+v", got)
		}
		if ok, _ := s.FinishTemplate(ctx, pub.ID, store.TemplateReady, "sha256:aa", "{}", ""); !ok {
			t.Fatal("finish public")
		}
		building, err := s.ListBuildingTemplates(ctx, "n1")
		if err != nil || len(building) != 1 || building[0].ID != other.ID || building[0].NodeID != "n1" {
			t.Fatalf("building: %+v %v", building, err)
		}
		if building, _ := s.ListBuildingTemplates(ctx, "n2"); len(building) != 0 {
			t.Fatalf("another node's builds: %+v", building)
		}

		// Delete: refused while a live sandbox started from it.
		sb := store.Sandbox{AccountID: alice.ID, NodeID: "n", Status: store.SandboxRunning, Runtime: "gvisor",
			Deadline: time.Now().Add(time.Hour), TemplateID: mine.ID}
		if err := s.CreateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		if row, _ := s.GetSandbox(ctx, sb.ID); row.TemplateID != mine.ID {
			t.Fatalf("sandbox's template %q", row.TemplateID)
		}
		_, err = s.DeleteTemplate(ctx, mine.ID)
		wantErr(t, "delete while used", err, store.ErrConflict)
		if _, err := s.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", time.Now()); err != nil {
			t.Fatal(err)
		}
		inUse, err := s.DeleteTemplate(ctx, mine.ID)
		if err != nil || !inUse {
			t.Fatalf("delete: in use %v, %v (the public one has the digest)", inUse, err)
		}
		inUse, err = s.DeleteTemplate(ctx, pub.ID)
		if err != nil || inUse {
			t.Fatalf("delete last: in use %v, %v", inUse, err)
		}
		_, err = s.DeleteTemplate(ctx, pub.ID)
		wantErr(t, "delete twice", err, store.ErrNotFound)
	})
}

func TestTemplateStepsAndLayerCache(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "alice")
		bob := mustAccount(t, s, store.AccountPersonal, "bob")

		tpl := store.Template{AccountID: alice.ID, Name: "app", Tag: "v1", Source: "registry.example/base", Definition: `{"steps":[]}`}
		if err := s.CreateTemplate(ctx, &tpl); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.SetTemplateLayers(ctx, tpl.ID, `["aa","bb"]`); !ok || err != nil {
			t.Fatalf("set layers: %v %v", ok, err)
		}
		if ok, _ := s.FinishTemplate(ctx, tpl.ID, store.TemplateReady, "sha256:aa", "{}", ""); !ok {
			t.Fatal("finish")
		}
		got, err := s.GetTemplate(ctx, tpl.ID)
		if err != nil || got.Definition != `{"steps":[]}` || got.Layers != `["aa","bb"]` {
			t.Fatalf("got %+v %v", got, err)
		}
		// Ended: its layers no longer change.
		if ok, _ := s.SetTemplateLayers(ctx, tpl.ID, `[]`); ok {
			t.Fatal("set the layers of a ready template")
		}

		// The cache: per account, replaced under the same key.
		_, err = s.GetTemplateLayer(ctx, alice.ID, "k1")
		wantErr(t, "no entry", err, store.ErrNotFound)
		if err := s.PutTemplateLayer(ctx, store.TemplateLayer{AccountID: alice.ID, CacheKey: "k1", BlobKey: "b1", Size: 10}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutTemplateLayer(ctx, store.TemplateLayer{AccountID: alice.ID, CacheKey: "k1", BlobKey: "b2", Size: 20}); err != nil {
			t.Fatal(err)
		}
		l, err := s.GetTemplateLayer(ctx, alice.ID, "k1")
		if err != nil || l.BlobKey != "b2" || l.Size != 20 {
			t.Fatalf("entry %+v %v", l, err)
		}
		_, err = s.GetTemplateLayer(ctx, bob.ID, "k1")
		wantErr(t, "another account's entry", err, store.ErrNotFound)
	})
}

func TestCountTemplatesWithBlob(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "alice")
		a, b, c := strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)
		saved := store.Template{AccountID: alice.ID, Name: "saved", Tag: "latest", Source: "sandbox:sbx", Layers: `["` + a + `","` + b + `"]`}
		if err := s.CreateTemplate(ctx, &saved); err != nil {
			t.Fatal(err)
		}
		if err := s.PutTemplateLayer(ctx, store.TemplateLayer{AccountID: alice.ID, CacheKey: "k", BlobKey: b, Size: 1}); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]int{a: 1, b: 2, c: 0, a[:63]: 0} {
			if n, err := s.CountTemplatesWithBlob(ctx, key); err != nil || n != want {
				t.Fatalf("count %s…: %d %v, want %d", key[:4], n, err, want)
			}
		}
		// No key turns into a pattern.
		for _, key := range []string{"", "%", `a"`, "_"} {
			if _, err := s.CountTemplatesWithBlob(ctx, key); err == nil {
				t.Fatalf("count %q: no error", key)
			}
		}
		if _, err := s.DeleteTemplate(ctx, saved.ID); err != nil {
			t.Fatal(err)
		}
		if n, err := s.CountTemplatesWithBlob(ctx, a); err != nil || n != 0 {
			t.Fatalf("after delete: %d %v", n, err)
		}
	})
}
