package templates_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestNamedSnapshots: a sandbox's files saved as a named snapshot are a
// ready template of kind snapshot, found by name or id, listed newest
// first (per sandbox too), started like a template; saving the name again
// replaces it (the old one stays untagged for its sandboxes), never a
// template of that name; an unnamed one is named by its id; a snapshot is
// promoted to a template that outlives it; delete refuses while a sandbox
// runs it; another account sees none of them.
func TestNamedSnapshots(t *testing.T) {
	securitytest.Attack(t, "snapshots", "another account reads, starts, promotes or deletes alice's named snapshot by its name or id",
		"not found: every snapshot route resolves the name or id within the account the caller acts for")
	f := newFixture(t)
	host := newFakeHost()
	svc, blobs, bi := saveFixture(t, f, host)
	ctx := t.Context()
	alice, bob := f.alice.AccountID, f.bob.AccountID

	sb := sandboxOn(t, f, host.rt, alice, store.Sandbox{}, runtime.Spec{BaseDir: bi.Dir, BaseImage: bi.ID}, map[string]string{"/work/a.txt": "one"})
	if _, err := svc.Snapshot(ctx, f.bob, sb.ID, "mine"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob snapshots alice's sandbox: %v", err)
	}
	first, err := svc.Snapshot(ctx, f.alice, sb.ID, "work")
	if err != nil {
		t.Fatal(err)
	}
	if !first.IsSnapshot() || first.Status != store.TemplateReady || first.Name != "work" || first.Tag != "latest" || templates.SavedFrom(first) != sb.ID {
		t.Fatalf("first: %+v", first)
	}
	img, err := svc.Find(ctx, alice, "work")
	if err != nil || !img.Snapshot || img.TemplateID != first.ID {
		t.Fatalf("find work: %+v %v", img, err)
	}
	for _, ref := range []string{"work", "work:latest", first.ID} {
		if got, err := svc.GetSnapshot(ctx, alice, ref); err != nil || got.ID != first.ID {
			t.Fatalf("get %s: %+v %v", ref, got, err)
		}
		if _, err := svc.GetSnapshot(ctx, bob, ref); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("bob gets %s: %v", ref, err)
		}
		if _, err := svc.PromoteSnapshot(ctx, bob, ref, "stolen"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("bob promotes %s: %v", ref, err)
		}
		if _, err := svc.DeleteSnapshot(ctx, bob, ref); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("bob deletes %s: %v", ref, err)
		}
	}

	// The name again: the new one holds it; the old one is untagged.
	time.Sleep(2 * time.Millisecond) // a later created_at, for the order
	rsb, err := host.rt.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := rsb.(*runtimefake.Sandbox).WriteFile(ctx, "/work/a.txt", strings.NewReader("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	second, err := svc.Snapshot(ctx, f.alice, sb.ID, "work")
	if err != nil {
		t.Fatal(err)
	}
	if second.ID == first.ID || second.Tag != "latest" {
		t.Fatalf("second: %+v", second)
	}
	if got, err := svc.GetSnapshot(ctx, alice, "work"); err != nil || got.ID != second.ID {
		t.Fatalf("work after the replace: %+v %v", got, err)
	}
	if _, err := svc.GetSnapshot(ctx, alice, first.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the replaced one by id: %v", err)
	}
	if old, err := f.st.GetTemplate(ctx, first.ID); err == nil && !old.Untagged() {
		t.Fatalf("the replaced one keeps tag %s", old.Tag)
	}
	layers := chainOf(t, second)
	if files := layerFiles(t, blobs, layers[len(layers)-1]); !slices.Contains(files, "work/a.txt") {
		t.Fatalf("second's layer holds %v", files)
	}

	// Unnamed: named by its id.
	time.Sleep(2 * time.Millisecond)
	anon, err := svc.Snapshot(ctx, f.alice, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if anon.Name != anon.ID {
		t.Fatalf("unnamed: name %q id %q", anon.Name, anon.ID)
	}
	if img, err := svc.Find(ctx, alice, anon.ID); err != nil || img.TemplateID != anon.ID {
		t.Fatalf("an unnamed snapshot starts by its id: %v", err)
	}

	// A template's name is not a snapshot's to take.
	if _, err := svc.FromSandbox(ctx, f.alice, sb.ID, "tool"); err != nil {
		t.Fatal(err)
	}
	_, err = svc.Snapshot(ctx, f.alice, sb.ID, "tool")
	wantClass(t, "a snapshot over a template", err, errdefs.ErrConflict, "is a template of the account, not a snapshot")
	_, err = svc.Snapshot(ctx, f.alice, sb.ID, "Bad")
	wantClass(t, "a bad name", err, errdefs.ErrInvalid, "lower-case")

	// Listed newest first, per sandbox, never a template nor bob's.
	other := sandboxOn(t, f, host.rt, alice, store.Sandbox{}, runtime.Spec{BaseDir: bi.Dir, BaseImage: bi.ID}, nil)
	time.Sleep(2 * time.Millisecond)
	third, err := svc.Snapshot(ctx, f.alice, other.ID, "other:v1")
	if err != nil {
		t.Fatal(err)
	}
	list, err := svc.Snapshots(ctx, alice, "")
	if err != nil {
		t.Fatal(err)
	}
	if ids := idsOf(list); !slices.Equal(ids, []string{third.ID, anon.ID, second.ID}) {
		t.Fatalf("list %v, want %v", ids, []string{third.ID, anon.ID, second.ID})
	}
	if list, _ := svc.Snapshots(ctx, alice, other.ID); !slices.Equal(idsOf(list), []string{third.ID}) {
		t.Fatalf("list of %s: %v", other.ID, idsOf(list))
	}
	if list, _ := svc.Snapshots(ctx, bob, ""); len(list) != 0 {
		t.Fatalf("bob lists %v", idsOf(list))
	}

	// Promoted: a template with the snapshot's files that outlives it.
	tpl, err := svc.PromoteSnapshot(ctx, alice, "work", "work-tpl:v1")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.IsSnapshot() || tpl.Status != store.TemplateReady || tpl.Layers != second.Layers || tpl.Digest != second.Digest {
		t.Fatalf("promoted: %+v", tpl)
	}
	_, err = svc.PromoteSnapshot(ctx, alice, "work", "tool")
	wantClass(t, "promote over a template", err, errdefs.ErrConflict, "exists")

	// In use: a delete is refused; after, the snapshot goes and its
	// layer stays for the template promoted from it.
	running := sandboxOn(t, f, host.rt, alice, store.Sandbox{TemplateID: second.ID}, runtime.Spec{BaseDir: bi.Dir, BaseImage: bi.ID}, nil)
	_, err = svc.DeleteSnapshot(ctx, alice, "work")
	wantClass(t, "delete while a sandbox runs it", err, errdefs.ErrConflict, "in use")
	if _, err := f.st.TransitionSandbox(ctx, running.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.DeleteSnapshot(ctx, alice, "work"); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.GetSnapshot(ctx, alice, "work"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if _, err := blobs.Stat(ctx, layers[len(layers)-1]); err != nil {
		t.Fatalf("the promoted template's layer went with the snapshot: %v", err)
	}
	if img, err := svc.Find(ctx, alice, "work-tpl:v1"); err != nil || img.Snapshot {
		t.Fatalf("the promoted template after the snapshot's delete: %+v %v", img, err)
	}
}

func idsOf(list []store.Template) []string {
	var out []string
	for _, t := range list {
		out = append(out, t.ID)
	}
	return out
}
