package templates_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/riverqueue/river"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/oci"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/templates"
)

func TestMain(m *testing.M) { storetest.Main(m) }

// fixture is a templates service on SQLite with an insert-only job
// client (the tests run builds themselves) and an in-process registry on
// loopback.
type fixture struct {
	st         *store.Store
	svc        *templates.Service
	dir        string
	alice, bob auth.Principal
	host       string
	blobGets   atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("unpacking an image keeps its owners: needs root")
	}
	f := &fixture{st: storetest.Open(t, storetest.SQLiteDSN(t))}
	jc, err := jobs.New(t.Context(), f.st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	f.dir = filepath.Join(t.TempDir(), "templates")
	f.svc, err = templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "here", Dir: f.dir, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*auth.Principal{&f.alice, &f.bob} {
		a := store.Account{Name: "u", Kind: store.AccountPersonal}
		if err := f.st.CreateAccount(t.Context(), &a); err != nil {
			t.Fatal(err)
		}
		*p = auth.Principal{AccountID: a.ID, Kind: a.Kind}
	}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet {
			f.blobGets.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f.host = strings.TrimPrefix(srv.URL, "http://")
	return f
}

// push writes an image of one layer holding files, with cfg, as repo:tag.
func (f *fixture) push(t *testing.T, repoTag string, cfg v1.Config, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	zw.Close()
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(buf.Bytes(), types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref, err := name.ParseReference(f.host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ref.String()
}

func wantClass(t *testing.T, what string, err, class error, words string) {
	t.Helper()
	if !errors.Is(err, class) || !strings.Contains(errdefs.Message(err, ""), words) {
		t.Fatalf("%s: %v; want %v saying %q", what, err, class, words)
	}
}

func TestBuildRefusesWhatIsNotBuiltYet(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	for _, c := range []struct {
		req   templates.BuildRequest
		class error
		words string
	}{
		{templates.BuildRequest{Name: "a", Dockerfile: "FROM x\nCOPY a /a\n"}, errdefs.ErrInvalid, "dockerfile: line 2 (COPY): COPY needs a build context"},
		{templates.BuildRequest{Name: "a", Image: "x", Context: strings.Repeat("a", 64)}, errdefs.ErrInvalid, "context: only with a dockerfile"},
		{templates.BuildRequest{Name: "a", Dockerfile: "FROM x\nCOPY a /a\n", Context: "abc"}, errdefs.ErrInvalid, "context: the files hash \"abc\" is not 64 lower-case hex digits"},
		{templates.BuildRequest{Name: "a", Image: "x", Dockerfile: "FROM x\n"}, errdefs.ErrInvalid, "image: must be absent with a dockerfile"},

		{templates.BuildRequest{Name: "a", Image: "x", Steps: []byte(`[{"type":"RUN","args":["true"]}]`)}, errdefs.ErrInvalid, "cannot run build steps"},
		{templates.BuildRequest{Name: "a", Steps: []byte(`[{"type":"RUN","args":["true"]}]`)}, errdefs.ErrInvalid, "image: required"},
		{templates.BuildRequest{Name: "a", FromTemplate: "nope"}, errdefs.ErrNotFound, "fromTemplate: template nope:latest not found"},
		{templates.BuildRequest{Name: "a", FromTemplate: "nope", Image: "x"}, errdefs.ErrInvalid, "image and fromTemplate: give one base"},
		{templates.BuildRequest{Name: "a", Image: "x", StartCmd: "serve\x00"}, errdefs.ErrInvalid, "startCmd: contains NUL"},
		{templates.BuildRequest{Name: "a", Image: "x", ReadyCmd: "true"}, errdefs.ErrInvalid, "cannot run build steps"},
		{templates.BuildRequest{Name: "a", Image: "x", Registry: &oci.Credentials{Username: "u", Password: "p"}}, errdefs.ErrInvalid, "registry: this server keeps no key for registry credentials"},
		{templates.BuildRequest{Name: "a", Image: "x", Registry: &oci.Credentials{Username: "u"}}, errdefs.ErrInvalid, "registry: password: required with a username"},
		{templates.BuildRequest{Image: "x"}, errdefs.ErrInvalid, "name: required"},
		{templates.BuildRequest{Name: "Upper", Image: "x"}, errdefs.ErrInvalid, "must start and end with a lower-case letter"},
		{templates.BuildRequest{Name: "a:"}, errdefs.ErrInvalid, "tag after ':' is empty"},
		{templates.BuildRequest{Name: "a"}, errdefs.ErrInvalid, "image: required"},
	} {
		_, err := f.svc.Build(ctx, f.alice, c.req)
		wantClass(t, "build "+c.words, err, c.class, c.words)
	}
	if list, _ := f.svc.List(ctx, f.alice); len(list) != 0 {
		t.Fatalf("refused builds left %d rows", len(list))
	}
}

func TestBuildFromAnImage(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	cfg := v1.Config{Env: []string{"FOO=bar", "PATH=/bin"}, WorkingDir: "/opt/app", User: "nobody", Cmd: []string{"serve"}}
	ref := f.push(t, "tools/py:3", cfg, map[string]string{"opt/app/hello.txt": "hi\n"})

	tpl, err := f.svc.Build(ctx, f.alice, templates.BuildRequest{Name: "py:v1", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Status != store.TemplateBuilding || tpl.Name != "py" || tpl.Tag != "v1" || tpl.AccountID != f.alice.AccountID {
		t.Fatalf("recorded %+v", tpl)
	}
	_, err = f.svc.Build(ctx, f.alice, templates.BuildRequest{Name: "py:v1", Image: ref})
	wantClass(t, "same name and tag", err, errdefs.ErrConflict, "exists")

	// Not ready yet: a sandbox cannot start from it.
	_, err = f.svc.Find(ctx, f.alice.AccountID, "py:v1")
	wantClass(t, "find while building", err, errdefs.ErrConflict, "still building")

	// The job's work; again (a job run after a restart) is a no-op.
	for range 2 {
		if err := f.svc.Run(ctx, tpl.ID); err != nil {
			t.Fatal(err)
		}
	}
	got, err := f.svc.Get(ctx, f.alice, tpl.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != store.TemplateReady || !strings.HasPrefix(got.Digest, "sha256:") || got.FailureReason != "" {
		t.Fatalf("built %+v", got)
	}
	for _, want := range []string{"resolving " + ref, "resolved to " + got.Digest, "layer applied", "ready: "} {
		if !strings.Contains(got.Log, want) {
			t.Fatalf("log lacks %q:\n%s", want, got.Log)
		}
	}
	img, err := f.svc.Find(ctx, f.alice.AccountID, "py:v1")
	if err != nil {
		t.Fatal(err)
	}
	if img.TemplateID != tpl.ID || img.BaseImage != "oci:"+got.Digest || img.Config.WorkingDir != "/opt/app" || img.Config.User != "nobody" ||
		strings.Join(img.Config.Env, ",") != "FOO=bar,PATH=/bin" {
		t.Fatalf("image %+v", img)
	}
	if b, err := os.ReadFile(filepath.Join(img.RootFS, "opt/app/hello.txt")); err != nil || string(b) != "hi\n" {
		t.Fatalf("rootfs file: %q %v", b, err)
	}
	if fi, err := os.Stat(f.dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("cache dir mode %v %v", fi.Mode(), err)
	}

	// Another template of the same image: resolved, not fetched again.
	before := f.blobGets.Load()
	tpl2, err := f.svc.Build(ctx, f.alice, templates.BuildRequest{Name: "py:v2", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Run(ctx, tpl2.ID); err != nil {
		t.Fatal(err)
	}
	got2, _ := f.st.GetTemplate(ctx, tpl2.ID)
	if got2.Status != store.TemplateReady || got2.Digest != got.Digest || !strings.Contains(got2.Log, "is cached on this server") {
		t.Fatalf("second build %+v", got2)
	}
	if n := f.blobGets.Load() - before; n != 1 { // the config blob only
		t.Fatalf("second build read %d blobs, want the config only", n)
	}

	// Access: another account sees neither, nor finds it.
	_, err = f.svc.Get(ctx, f.bob, tpl.ID)
	wantClass(t, "another account's", err, errdefs.ErrNotFound, "Template not found")
	wantClass(t, "delete another account's", f.svc.Delete(ctx, f.bob, tpl.ID), errdefs.ErrNotFound, "Template not found")
	_, err = f.svc.Find(ctx, f.bob.AccountID, "py:v1")
	wantClass(t, "find another account's", err, errdefs.ErrNotFound, "not found")
	if list, _ := f.svc.List(ctx, f.bob); len(list) != 0 {
		t.Fatalf("bob lists %d", len(list))
	}

	// Delete: refused while a sandbox runs from it; the cache stays while
	// another template names the image, and goes with the last.
	sb := store.Sandbox{AccountID: f.alice.AccountID, NodeID: "here", Status: store.SandboxRunning, Runtime: "gvisor",
		Deadline: time.Now().Add(time.Hour), TemplateID: tpl.ID}
	if err := f.st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	wantClass(t, "delete in use", f.svc.Delete(ctx, f.alice, tpl.ID), errdefs.ErrConflict, "in use by running or paused sandboxes")
	if _, err := f.st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxRunning}, store.SandboxStopped, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Delete(ctx, f.alice, tpl.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img.RootFS); err != nil {
		t.Fatalf("cache removed while py:v2 names it: %v", err)
	}
	if err := f.svc.Delete(ctx, f.alice, tpl2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(img.RootFS); !os.IsNotExist(err) {
		t.Fatalf("cache kept after the last template: %v", err)
	}
}

func TestBuildFailsWithAReasonForItsUser(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	tpl, err := f.svc.Build(ctx, f.alice, templates.BuildRequest{Name: "gone", Image: f.host + "/no/such:image"})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Run(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := f.svc.Get(ctx, f.alice, tpl.ID)
	if got.Status != store.TemplateFailed || !strings.Contains(got.FailureReason, "was not found in its registry") ||
		!strings.Contains(got.Log, "build failed: ") || strings.Contains(got.FailureReason, f.dir) {
		t.Fatalf("failed build %+v", got)
	}
	_, err = f.svc.Find(ctx, f.alice.AccountID, "gone")
	wantClass(t, "find a failed one", err, errdefs.ErrConflict, "failed to build: ")

	// Without the operator's flag a loopback registry is refused.
	jc, _ := jobs.New(ctx, f.st, jobs.Config{NodeID: "here"})
	defer jc.Close()
	strict, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "here", Dir: f.dir})
	if err != nil {
		t.Fatal(err)
	}
	ref := f.push(t, "x/y:1", v1.Config{}, map[string]string{"a": "b"})
	tpl, err = strict.Build(ctx, f.alice, templates.BuildRequest{Name: "private", Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if err := strict.Run(ctx, tpl.ID); err != nil {
		t.Fatal(err)
	}
	got, _ = f.svc.Get(ctx, f.alice, tpl.ID)
	if got.Status != store.TemplateFailed || !strings.Contains(got.FailureReason, "which this server does not connect to") {
		t.Fatalf("private registry %+v", got)
	}
}

func TestPublicTemplates(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	pub := store.Template{Name: "py", Tag: "latest", Source: "registry.example/py"}
	if err := f.st.CreateTemplate(ctx, &pub); err != nil {
		t.Fatal(err)
	}
	own := store.Template{AccountID: f.alice.AccountID, Name: "py", Tag: "latest", Source: "registry.example/py"}
	if err := f.st.CreateTemplate(ctx, &own); err != nil {
		t.Fatal(err)
	}
	for _, p := range []auth.Principal{f.alice, f.bob} {
		if _, err := f.svc.Get(ctx, p, pub.ID); err != nil {
			t.Fatalf("public get: %v", err)
		}
	}
	wantClass(t, "delete public", f.svc.Delete(ctx, f.alice, pub.ID), errdefs.ErrForbidden, "operator's")
	// The account's own comes first; another account gets the public one.
	if list, _ := f.svc.List(ctx, f.alice); len(list) != 2 || list[0].ID != own.ID {
		t.Fatalf("alice lists %+v", list)
	}
	if list, _ := f.svc.List(ctx, f.bob); len(list) != 1 || list[0].ID != pub.ID {
		t.Fatalf("bob lists %+v", list)
	}
}

// TestBuildResumesAfterARestart: a template left building by a node that
// stopped (its job gone with it) is built once the node is back: Resume
// enqueues it, and River's worker (registered as serve does) builds it.
func TestBuildResumesAfterARestart(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	ref := f.push(t, "tools/sh:1", v1.Config{Env: []string{"A=b"}}, map[string]string{"x": "y"})
	// The row as the stopped node left it: building, on this node.
	tpl := store.Template{AccountID: f.alice.AccountID, Name: "sh", Tag: "1", Source: ref, NodeID: "here"}
	if err := f.st.CreateTemplate(ctx, &tpl); err != nil {
		t.Fatal(err)
	}
	workers := river.NewWorkers()
	jc, err := jobs.New(ctx, f.st, jobs.Config{NodeID: "here", Workers: workers, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := templates.New(templates.Config{Store: f.st, Jobs: jc, NodeID: "here", Dir: f.dir, AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	svc.RegisterWorkers(workers)
	if err := jc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = jc.Stop(context.Background()) })
	if err := svc.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err := f.st.GetTemplate(ctx, tpl.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status == store.TemplateReady {
			break
		}
		if got.Status == store.TemplateFailed || time.Now().After(deadline) {
			t.Fatalf("resumed build: %+v", got)
		}
	}
}
