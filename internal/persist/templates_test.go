package persist

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// oneTemplate is a templates service that knows one ready template.
type oneTemplate struct{ img templates.Image }

func (o oneTemplate) Find(_ context.Context, _, name string) (templates.Image, error) {
	if name != o.img.Ref {
		return templates.Image{}, errdefs.Newf(errdefs.ErrNotFound, "template %s not found", name)
	}
	return o.img, nil
}

func (o oneTemplate) ByID(_ context.Context, id string) (templates.Image, error) {
	if id != o.img.TemplateID {
		return templates.Image{}, errdefs.New(errdefs.ErrNotFound, "its template was deleted")
	}
	return o.img, nil
}

// TestTemplateSandboxesKeepOffTheAccountsSnapshot: the account's snapshot
// is a layer over the built-in image; a sandbox from a custom template
// never starts from it and never writes it, and the sandbox started ahead
// from it (the same BaseDir only) never serves a template's create.
func TestTemplateSandboxesKeepOffTheAccountsSnapshot(t *testing.T) {
	securitytest.Attack(t, "templates",
		"an account with a snapshot creates a sandbox from a custom template, then its run's work would be saved",
		"the sandbox starts on the template's root filesystem without the account's layers, is never prewarm-matched with the built-in image's, and capturing it is refused: the account's snapshot stays the one taken on the built-in image")
	f := newChainFixture(t, Options{MaxDepth: 8})
	ctx := context.Background()
	snap, err := f.capture(t, map[string]string{"/f": "1"})
	if err != nil {
		t.Fatal(err)
	}
	img := templates.Image{TemplateID: "tpl_py", Ref: "py:latest", RootFS: t.TempDir(), BaseImage: "oci:sha256:abc",
		Config: oci.Config{Env: []string{"FOO=bar"}, WorkingDir: "/opt/app", User: "nobody:nogroup"}}
	m := sandbox.NewManager(sandbox.Config{Store: f.st, Runtime: f.rt, NodeID: "here", DataDir: t.TempDir(), BaseDir: "/base", BaseID: "base-1",
		Persist: f.svc, Hooks: f.svc.Hooks(), Templates: oneTemplate{img}})

	sb, _, err := m.Create(ctx, f.account.ID, sandbox.CreateRequest{Template: "py:latest"})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := f.rt.Spec(sb.ID)
	row, _ := f.st.GetSandbox(ctx, sb.ID)
	if len(spec.Layers) != 0 || row.SnapshotID != "" || row.TemplateID != img.TemplateID {
		t.Fatalf("template sandbox: layers %v, snapshot %q, template %q", spec.Layers, row.SnapshotID, row.TemplateID)
	}
	if spec.BaseDir != img.RootFS || spec.BaseImage != img.BaseImage || !slices.Contains(spec.Env, "FOO=bar") {
		t.Fatalf("spec %+v", spec)
	}
	// A user's commands default to the image's WORKDIR and USER (the
	// service's own, in persist and agents, name theirs and run as root).
	if cwd, user, err := m.ExecDefaults(ctx, row); cwd != "/opt/app" || user != "nobody" || err != nil {
		t.Fatalf("exec defaults %q %q %v", cwd, user, err)
	}
	if cwd, user, _ := m.ExecDefaults(ctx, store.Sandbox{ID: "sbx_plain"}); cwd != "" || user != "" {
		t.Fatalf("exec defaults of a built-in image's sandbox %q %q", cwd, user)
	}
	// The built-in image's sandbox of the same account restores it, and
	// the two never share a prewarmed sandbox.
	plain, _, err := m.Create(ctx, f.account.ID, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pspec, _ := f.rt.Spec(plain.ID)
	if plain.SnapshotID != snap.ID || len(pspec.Layers) != 1 {
		t.Fatalf("built-in sandbox: snapshot %q, layers %v", plain.SnapshotID, pspec.Layers)
	}
	ktpl, ok1 := runtime.PrewarmKey(spec)
	pspec.Layers = nil
	kplain, ok2 := runtime.PrewarmKey(pspec)
	if ok1 && ok2 && ktpl == kplain {
		t.Fatal("a template's spec has the prewarm key of the built-in image's")
	}

	// Its work is never the account's snapshot.
	rsb, err := f.rt.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Capture(ctx, row, rsb); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("capture of a template sandbox: %v", err)
	}
	saved, err := f.svc.AfterRun(ctx, row, rsb, store.Run{ID: "run_x", AccountID: f.account.ID, SandboxID: sb.ID})
	if err != nil && saved.SnapshotID != "" {
		t.Fatalf("after run: %+v %v", saved, err)
	}
	if saved.SnapshotID != "" {
		t.Fatalf("after run took snapshot %s", saved.SnapshotID)
	}
	env, err := f.st.GetEnvironment(ctx, f.account.ID)
	if err != nil || env.SnapshotID == nil || *env.SnapshotID != snap.ID {
		t.Fatalf("the account's snapshot moved: %+v %v", env, err)
	}
	for _, id := range []string{sb.ID, plain.ID} {
		if r, err := f.rt.Get(ctx, id); err == nil {
			_ = f.svc.Prepare(ctx, store.Sandbox{ID: id, AccountID: f.account.ID}, r, false)
		}
	}

	// A backend that cannot start any root filesystem refuses templates.
	f.rt.SetCapabilities(runtime.Capabilities{Network: true})
	_, _, err = m.Create(ctx, f.account.ID, sandbox.CreateRequest{Template: "py:latest"})
	if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Message(err, "") != "this server's runtime cannot start custom templates" {
		t.Fatalf("a backend without AnyRootFS: %v", err)
	}
	f.rt.SetCapabilities(runtime.Capabilities{Network: true, AnyRootFS: true})
	_, _, err = m.Create(ctx, f.account.ID, sandbox.CreateRequest{Template: "nope"})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown template: %v", err)
	}
}

// TestCollectKeepsLayersTemplatesName: a template saved from a sandbox on
// the built-in image names the account's snapshot layers it started from;
// once those snapshots are replaced and collected, their rows go but the
// blobs a template names stay (its sandboxes restore them), and go with
// the template.
func TestCollectKeepsLayersTemplatesName(t *testing.T) {
	securitytest.Attack(t, "templates", "a template saved on the built-in image names the account's snapshot layers; the account's snapshot moves on and the old snapshots are collected",
		"the snapshot rows go, the blobs the template names stay (the collection asks the templates), so the template never starts without its layers")
	f := newChainFixture(t, Options{MaxDepth: 1})
	ctx := context.Background()
	first, err := f.capture(t, map[string]string{"/f": "1"})
	if err != nil {
		t.Fatal(err)
	}
	unnamed, err := f.capture(t, map[string]string{"/f": "2"})
	if err != nil {
		t.Fatal(err)
	}
	saved := store.Template{AccountID: f.account.ID, Name: "saved", Tag: "latest", Source: "sandbox:x", Status: store.TemplateReady,
		Digest: templates.BuiltinDigest("base-1"), Layers: `["` + first.BlobKey + `"]`}
	if err := f.st.CreateTemplate(ctx, &saved); err != nil {
		t.Fatal(err)
	}
	if _, err := f.capture(t, map[string]string{"/f": "3"}); err != nil {
		t.Fatal(err)
	}
	f.advance(2 * time.Minute)
	f.svc.collect(ctx)
	blobs := f.storedBlobs(t)
	if _, err := f.st.GetSnapshot(ctx, first.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the replaced snapshot's row: %v", err)
	}
	if !slices.Contains(blobs, first.BlobKey) || slices.Contains(blobs, unnamed.BlobKey) {
		t.Fatalf("blobs %v: want the template's %s kept and %s collected", blobs, first.BlobKey[:8], unnamed.BlobKey[:8])
	}
	// The blob is deleted with the last reference: here, when the
	// deleted template's layer is dropped as a snapshot's would be.
	if _, err := f.st.DeleteTemplate(ctx, saved.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.deleteBlobIfUnused(ctx, first.BlobKey); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(f.storedBlobs(t), first.BlobKey) {
		t.Fatal("an unreferenced blob stayed")
	}
}
