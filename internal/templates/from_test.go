package templates_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/snapshot"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

func chainOf(t *testing.T, tpl store.Template) []string {
	t.Helper()
	if tpl.Layers == "" {
		return nil
	}
	var l []string
	if err := json.Unmarshal([]byte(tpl.Layers), &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestBuildOverATemplate: a template built over another starts from its
// image and layers, with its config and start and ready commands unless
// it gives its own; its steps run over the parent's chain and are cached
// under keys chained from the parent's. Building and failed parents are
// refused, and so is another account's; a deleted parent leaves its
// children whole.
func TestBuildOverATemplate(t *testing.T) {
	securitytest.Attack(t, "templates", "another account builds a template over alice's, by name and by id",
		"404 \"fromTemplate: template … not found\": the parent resolves under the one access rule (own or public), and nothing is recorded")
	f := newFixture(t)
	host := newFakeHost()
	svc := stepsService(t, f, host, 0)
	ctx := t.Context()
	ref := f.push(t, "tools/base:1", v1.Config{Env: []string{"PATH=/bin"}}, map[string]string{"etc/hostname": "x\n"})

	a := build(t, f, svc, templates.BuildRequest{Name: "a:v1", Image: ref, Steps: steps(t,
		`{"type":"ENV","args":["A","1"]}`, `{"type":"RUN","args":["make a"]}`, `{"type":"WORKDIR","args":["/srv"]}`, `{"type":"USER","args":["nobody"]}`),
		StartCmd: "serve a"})
	if a.Status != store.TemplateReady {
		t.Fatalf("a: %s %s\n%s", a.Status, a.FailureReason, a.Log)
	}
	aLayers := chainOf(t, a)

	// By name, with a RUN and an ENV: over a's chain, as a's user, in a's
	// directory, with a's environment.
	before := len(host.commands())
	b := build(t, f, svc, templates.BuildRequest{Name: "b:v1", FromTemplate: "a:v1", Steps: steps(t,
		`{"type":"ENV","args":["B","2"]}`, `{"type":"RUN","args":["make b"]}`)})
	if b.Status != store.TemplateReady || b.Digest != a.Digest || b.Source != "template:a:v1" {
		t.Fatalf("b: %s %s digest %s source %s\n%s", b.Status, b.FailureReason, b.Digest, b.Source, b.Log)
	}
	bLayers := chainOf(t, b)
	if len(bLayers) != len(aLayers)+1 || !slices.Equal(bLayers[:len(aLayers)], aLayers) {
		t.Fatalf("b's chain %v, a's %v", bLayers, aLayers)
	}
	host.mu.Lock()
	runB := host.runs[before]
	startB := host.starts[len(host.starts)-2] // the RUN's, before finalize's
	host.mu.Unlock()
	if runB.Cmd[2] != "make b" || runB.User != "nobody" || runB.Cwd != "/srv" || strings.Join(runB.Env, " ") != "PATH=/bin A=1 B=2" {
		t.Fatalf("b's RUN %+v", runB)
	}
	if len(startB) != len(aLayers) || startB[0] != "sha256:"+aLayers[0] {
		t.Fatalf("b's build sandbox from %v, a's layers %v", startB, aLayers)
	}
	img, err := svc.Find(ctx, f.alice.AccountID, "b:v1")
	if err != nil {
		t.Fatal(err)
	}
	if img.StartCmd != "serve a" || img.Config.WorkingDir != "/srv" || img.Config.User != "nobody" || strings.Join(img.Config.Env, " ") != "PATH=/bin A=1 B=2" {
		t.Fatalf("b's image %+v", img)
	}
	if !strings.Contains(b.Log, "over template a:v1") || !strings.Contains(b.Log, "finalize: ready") {
		t.Fatalf("b's log:\n%s", b.Log)
	}

	// The same steps over the same parent, by id: cached.
	c := build(t, f, svc, templates.BuildRequest{Name: "c:v1", FromTemplate: a.ID, Steps: steps(t,
		`{"type":"ENV","args":["B","2"]}`, `{"type":"RUN","args":["make b"]}`), StartCmd: "serve c", ReadyCmd: "check c"})
	if c.Status != store.TemplateReady || !strings.Contains(c.Log, "step 2/2: cached") || !slices.Equal(chainOf(t, c), bLayers) {
		t.Fatalf("c: %s %s %v\n%s", c.Status, c.FailureReason, chainOf(t, c), c.Log)
	}
	if img, _ := svc.Find(ctx, f.alice.AccountID, "c:v1"); img.StartCmd != "serve c" || img.ReadyCmd != "check c" {
		t.Fatalf("c's commands %q %q", img.StartCmd, img.ReadyCmd)
	}
	// The same RUN over an image is another key: not cached.
	d := build(t, f, svc, templates.BuildRequest{Name: "d:v1", Image: ref, Steps: steps(t, `{"type":"ENV","args":["B","2"]}`, `{"type":"RUN","args":["make b"]}`)})
	if strings.Contains(d.Log, "step 2/2: cached") {
		t.Fatalf("d took a layer made over a template:\n%s", d.Log)
	}

	// No steps, no new commands: nothing runs; a's chain and config.
	starts := len(host.starts)
	e := build(t, f, svc, templates.BuildRequest{Name: "e:v1", FromTemplate: "a:v1"})
	if e.Status != store.TemplateReady || !slices.Equal(chainOf(t, e), aLayers) || len(host.starts) != starts {
		t.Fatalf("e: %s %s %v, %d build sandboxes", e.Status, e.FailureReason, chainOf(t, e), len(host.starts)-starts)
	}

	// Refused: another account's (by name and id), a building one, a
	// failed one, with an image or a Dockerfile.
	for _, r := range []string{"a:v1", a.ID} {
		_, err := svc.Build(ctx, f.bob, templates.BuildRequest{Name: "x", FromTemplate: r})
		wantClass(t, "bob over "+r, err, errdefs.ErrNotFound, "not found")
	}
	building, err := svc.Build(ctx, f.alice, templates.BuildRequest{Name: "slow:v1", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.Build(ctx, f.alice, templates.BuildRequest{Name: "x", FromTemplate: building.ID})
	wantClass(t, "over a building one", err, errdefs.ErrConflict, "fromTemplate: template slow:v1 is still building")
	bad := build(t, f, svc, templates.BuildRequest{Name: "bad:v1", Image: ref, Steps: steps(t, `{"type":"RUN","args":["exit 3"]}`)})
	_, err = svc.Build(ctx, f.alice, templates.BuildRequest{Name: "x", FromTemplate: "bad:v1"})
	wantClass(t, "over a failed one", err, errdefs.ErrInvalid, "fromTemplate: template bad:v1 failed to build ("+bad.FailureReason+")")
	_, err = svc.Build(ctx, f.alice, templates.BuildRequest{Name: "x", FromTemplate: "a:v1", Dockerfile: "FROM x\n"})
	wantClass(t, "with a dockerfile", err, errdefs.ErrInvalid, "dockerfile and fromTemplate")
	_, err = svc.Build(ctx, f.alice, templates.BuildRequest{Name: "x", FromTemplate: "a:v1", Registry: &oci.Credentials{Username: "u", Password: "p"}})
	wantClass(t, "with registry credentials", err, errdefs.ErrInvalid, "registry and fromTemplate")

	// A public template is everyone's parent.
	pub := store.Template{Name: "pub", Tag: "latest", Source: "x", Status: store.TemplateReady, Digest: a.Digest, Config: `{"Env":["P=1"]}`}
	if err := f.st.CreateTemplate(ctx, &pub); err != nil {
		t.Fatal(err)
	}
	mine, err := svc.Build(ctx, f.bob, templates.BuildRequest{Name: "mine", FromTemplate: "pub"})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Run(ctx, mine.ID); err != nil {
		t.Fatal(err)
	}
	if img, err := svc.Find(ctx, f.bob.AccountID, "mine"); err != nil || strings.Join(img.Config.Env, " ") != "P=1" {
		t.Fatalf("bob's over the public one: %+v %v", img, err)
	}

	// A child queued before its parent is deleted still builds, and
	// children keep working once it is gone.
	late, err := svc.Build(ctx, f.alice, templates.BuildRequest{Name: "late:v1", FromTemplate: "a:v1", Steps: steps(t, `{"type":"RUN","args":["make late"]}`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a.ID, building.ID} {
		if err := svc.Delete(ctx, f.alice, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.Run(ctx, late.ID); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"b:v1", "late:v1"} {
		img, err := svc.Find(ctx, f.alice.AccountID, name)
		if err != nil {
			t.Fatalf("%s after its parent's delete: %v", name, err)
		}
		layers, release, err := img.OpenLayers(ctx)
		if err != nil {
			t.Fatalf("%s's layers: %v", name, err)
		}
		for _, l := range layers {
			io.Copy(io.Discard, l.R)
		}
		release()
		if _, err := os.Stat(img.RootFS); err != nil {
			t.Fatalf("%s's root filesystem: %v", name, err)
		}
	}
	_, err = svc.Build(ctx, f.alice, templates.BuildRequest{Name: "x", FromTemplate: "a:v1"})
	wantClass(t, "over a deleted one", err, errdefs.ErrNotFound, "not found")
}

// saver is a templates.SandboxSaver over runtimefake: the account rule
// (another account's sandbox is not found) and the runtime's Snapshot.
type saver struct {
	st *store.Store
	rt *runtimefake.Runtime
}

func (s saver) SandboxToSave(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	sb, err := s.st.GetSandbox(ctx, id)
	if err != nil || sb.AccountID != p.AccountID {
		return store.Sandbox{}, errdefs.New(errdefs.ErrNotFound, "Sandbox not found")
	}
	return sb, nil
}

func (s saver) CaptureFiles(ctx context.Context, sb store.Sandbox, w io.Writer) (snapshot.Manifest, error) {
	rsb, err := s.rt.Get(ctx, sb.ID)
	if err != nil {
		return snapshot.Manifest{}, err
	}
	return rsb.Snapshot(ctx, w)
}

// saveFixture is a service that saves sandboxes of rt, whose built-in
// image is "base-1" at a directory of its own.
func saveFixture(t *testing.T, f *fixture, host *fakeHost) (*templates.Service, blob.Store, templates.Builtin) {
	t.Helper()
	blobs, err := blob.NewLocal(filepath.Join(t.TempDir(), "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	jc, err := jobs.New(t.Context(), f.st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	bi := templates.Builtin{ID: "base-1", Dir: t.TempDir()}
	svc, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "here", Dir: f.dir, AllowPrivate: true,
		Blobs: blobs, Host: host, Saver: saver{f.st, host.rt}, Builtin: bi})
	if err != nil {
		t.Fatal(err)
	}
	return svc, blobs, bi
}

// sandboxOn records a running sandbox of account and starts it on rt
// from spec, with files written in it.
func sandboxOn(t *testing.T, f *fixture, rt *runtimefake.Runtime, account string, row store.Sandbox, spec runtime.Spec, files map[string]string) store.Sandbox {
	t.Helper()
	ctx := t.Context()
	row.AccountID, row.NodeID = account, "here"
	if err := f.st.CreateSandbox(ctx, &row); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.TransitionSandbox(ctx, row.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", row.CreatedAt); err != nil {
		t.Fatal(err)
	}
	spec.ID = row.ID
	rsb, err := rt.Create(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	for p, body := range files {
		if err := rsb.(*runtimefake.Sandbox).WriteFile(ctx, p, strings.NewReader(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	row, _ = f.st.GetSandbox(ctx, row.ID)
	return row
}

// TestSaveSandbox: a running sandbox's writable layer becomes a ready
// template over what the sandbox stands on: its template (image, chain,
// config, commands), or the built-in image with the account's snapshot
// chain it started from, which the template's row then names (so the
// snapshots' collection keeps those blobs). A layer that does not sit on
// that chain is refused and leaves nothing; another account's sandbox is
// not found.
func TestSaveSandbox(t *testing.T) {
	securitytest.Attack(t, "templates", "another account saves alice's running sandbox as a template of its own",
		"not found: the sandbox is loaded under the one access rule before anything is captured or recorded")
	f := newFixture(t)
	host := newFakeHost()
	svc, blobs, bi := saveFixture(t, f, host)
	ctx := t.Context()
	ref := f.push(t, "tools/base:1", v1.Config{Env: []string{"PATH=/bin"}}, map[string]string{"etc/hostname": "x\n"})
	a := build(t, f, svc, templates.BuildRequest{Name: "a:v1", Image: ref, Steps: steps(t, `{"type":"RUN","args":["make a"]}`, `{"type":"USER","args":["nobody"]}`),
		StartCmd: "serve"})
	if a.Status != store.TemplateReady {
		t.Fatalf("a: %s\n%s", a.FailureReason, a.Log)
	}

	// On a template.
	aimg, err := svc.Find(ctx, f.alice.AccountID, "a:v1")
	if err != nil {
		t.Fatal(err)
	}
	layers, release, err := aimg.OpenLayers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb := sandboxOn(t, f, host.rt, f.alice.AccountID, store.Sandbox{TemplateID: a.ID},
		runtime.Spec{BaseDir: aimg.RootFS, BaseImage: aimg.BaseImage, Layers: layers}, map[string]string{"/work/notes.txt": "hi"})
	release()
	if _, err := svc.FromSandbox(ctx, f.bob, sb.ID, "mine"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bob saves alice's sandbox: %v", err)
	}
	c, err := svc.FromSandbox(ctx, f.alice, sb.ID, "c:v1")
	if err != nil {
		t.Fatal(err)
	}
	cLayers := chainOf(t, c)
	if c.Status != store.TemplateReady || c.Digest != a.Digest || c.Source != "sandbox:"+sb.ID || len(cLayers) != len(chainOf(t, a))+1 || !strings.Contains(c.Log, "saved: layer") {
		t.Fatalf("c: %+v", c)
	}
	cimg, err := svc.Find(ctx, f.alice.AccountID, "c:v1")
	if err != nil || cimg.StartCmd != "serve" || cimg.Config.User != "nobody" || cimg.BaseImage != aimg.BaseImage {
		t.Fatalf("c's image %+v %v", cimg, err)
	}
	if files := layerFiles(t, blobs, cLayers[len(cLayers)-1]); !slices.Contains(files, "work/notes.txt") {
		t.Fatalf("c's layer holds %v", files)
	}
	if _, err := svc.FromSandbox(ctx, f.alice, sb.ID, "c:v1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("the same name again: %v", err)
	}

	// On the built-in image, from the account's snapshot chain.
	var chain []string
	parentID := ""
	for i, body := range []string{"one", "two"} {
		key := putLayer(t, blobs, host.rt, bi.ID, chain, map[string]string{"/f": body})
		sn := store.Snapshot{AccountID: f.alice.AccountID, ParentID: parentID, BaseImage: bi.ID, BlobKey: key, Size: 1, Depth: i + 1}
		if err := f.st.CreateSnapshot(ctx, &sn); err != nil {
			t.Fatal(err)
		}
		chain, parentID = append(chain, key), sn.ID
	}
	var specLayers []runtime.Layer
	for _, k := range chain {
		specLayers = append(specLayers, runtime.Layer{ID: "sha256:" + k, R: strings.NewReader("")})
	}
	sb2 := sandboxOn(t, f, host.rt, f.alice.AccountID, store.Sandbox{SnapshotID: parentID},
		runtime.Spec{BaseDir: bi.Dir, BaseImage: bi.ID, Layers: specLayers}, map[string]string{"/g": "three"})
	d, err := svc.FromSandbox(ctx, f.alice, sb2.ID, "d")
	if err != nil {
		t.Fatal(err)
	}
	dLayers := chainOf(t, d)
	if d.Digest != templates.BuiltinDigest(bi.ID) || len(dLayers) != 3 || !slices.Equal(dLayers[:2], chain) {
		t.Fatalf("d: digest %s chain %v (the account's %v)", d.Digest, dLayers, chain)
	}
	dimg, err := svc.Find(ctx, f.alice.AccountID, "d")
	if err != nil || dimg.RootFS != bi.Dir || dimg.BaseImage != bi.ID || len(dimg.Layers) != 3 {
		t.Fatalf("d's image %+v %v", dimg, err)
	}
	for _, k := range chain {
		if n, err := f.st.CountTemplatesWithBlob(ctx, k); err != nil || n != 1 {
			t.Fatalf("snapshot layer %s named by %d templates (%v)", k[:8], n, err)
		}
	}
	// Another built-in image: d does not start there.
	other, err := templates.NewCatalog(f.st, f.dir, blobs)
	if err != nil {
		t.Fatal(err)
	}
	other.SetBuiltin(templates.Builtin{ID: "base-2", Dir: t.TempDir()})
	_, err = other.Find(ctx, f.alice.AccountID, "d")
	wantClass(t, "on another built-in", err, errdefs.ErrConflict, "saved on the built-in image base-1, which this server does not run")

	// A layer that does not sit on the chain the row says (a sandbox
	// restored another way): refused, and nothing is left.
	sb3 := sandboxOn(t, f, host.rt, f.alice.AccountID, store.Sandbox{SnapshotID: parentID},
		runtime.Spec{BaseDir: bi.Dir, BaseImage: bi.ID}, map[string]string{"/h": "x"})
	_, err = svc.FromSandbox(ctx, f.alice, sb3.ID, "e")
	wantClass(t, "off its chain", err, errdefs.ErrConflict, "do not sit on the layers it started from")
	if _, err := f.st.FindTemplate(ctx, f.alice.AccountID, "e", "latest"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused save left its row: %v", err)
	}
	_, err = svc.FromSandbox(ctx, f.alice, sb3.ID, "Bad")
	wantClass(t, "a bad name", err, errdefs.ErrInvalid, "lower-case")

	// A template over a saved one.
	g := build(t, f, svc, templates.BuildRequest{Name: "g", FromTemplate: "d", Steps: steps(t, `{"type":"RUN","args":["make g"]}`)})
	if g.Status != store.TemplateReady || g.Digest != d.Digest || len(chainOf(t, g)) != 4 {
		t.Fatalf("g over d: %s %s %v\n%s", g.Status, g.FailureReason, chainOf(t, g), g.Log)
	}
}

// putLayer stores a layer of files over base and parents (as a sandbox
// restored from them would make it) and returns its blob key.
func putLayer(t *testing.T, blobs blob.Store, rt *runtimefake.Runtime, base string, parents []string, files map[string]string) string {
	t.Helper()
	var ls []runtime.Layer
	for _, k := range parents {
		ls = append(ls, runtime.Layer{ID: "sha256:" + k, R: strings.NewReader("")})
	}
	rsb, err := rt.Create(t.Context(), runtime.Spec{ID: store.NewID("lyr_"), BaseImage: base, Layers: ls})
	if err != nil {
		t.Fatal(err)
	}
	for p, body := range files {
		rsb.(*runtimefake.Sandbox).WriteFile(t.Context(), p, strings.NewReader(body), 0o644)
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := rsb.Snapshot(t.Context(), pw)
		pw.CloseWithError(err)
	}()
	info, err := blobs.Put(t.Context(), pr)
	if err != nil {
		t.Fatal(err)
	}
	return info.Key
}

// layerFiles lists the entries of a stored layer.
func layerFiles(t *testing.T, blobs blob.Store, key string) []string {
	t.Helper()
	rc, err := blobs.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	dir := t.TempDir()
	if _, err := snapshot.Apply(t.Context(), rc, dir, nil); err != nil {
		t.Fatal(err)
	}
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	return out
}
