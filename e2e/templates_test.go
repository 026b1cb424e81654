package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
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
)

// TestTemplateFromImage: an image the test builds (the test root
// filesystem the other tests start from, plus a layer with an app
// directory, and a config with ENV, WORKDIR and USER), pushed to an
// in-process registry on loopback (the operator's flag allows it), built
// into a template through the API; a sandbox started from it runs its
// commands with the image's environment, in its WORKDIR, as its USER.
// Another account sees neither the template nor its name.
func TestTemplateFromImage(t *testing.T) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	img := templateImage(t, v1.Config{
		Env:        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FOO=bar"},
		WorkingDir: "/opt/app",
		User:       "nobody",
	})
	ref, err := name.ParseReference(host + "/apps/hello:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	s := startServer(t, filepath.Join(t.TempDir(), "templates.db"), "--templates-allow-private-registries")
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)

	// What is not built yet is refused by name.
	if r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "x", "dockerfile": "FROM " + ref.String() + "\nCOPY a /a\n"}); r.Status != 400 ||
		!strings.Contains(fmt.Sprint(r.Body["error"]), "COPY needs a build context") {
		t.Fatalf("dockerfile: %d %s", r.Status, r.Raw)
	}

	r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "hello:v1", "image": ref.String()})
	if r.Status != 202 {
		t.Fatalf("build: %d %s", r.Status, r.Raw)
	}
	tpl := r.Body["template"].(map[string]any)
	id := tpl["id"].(string)
	if tpl["status"] != "building" || !strings.HasPrefix(id, "tpl_") {
		t.Fatalf("build answered %s", r.Raw)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r = s.as(ak, "GET", "/api/templates/"+id, nil)
		if r.Status != 200 {
			t.Fatalf("get: %d %s", r.Status, r.Raw)
		}
		tpl = r.Body["template"].(map[string]any)
		if tpl["status"] != "building" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still building: %s", r.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if tpl["status"] != "ready" || !strings.HasPrefix(fmt.Sprint(tpl["digest"]), "sha256:") || !strings.Contains(fmt.Sprint(tpl["log"]), "ready: ") {
		t.Fatalf("build ended %s", r.Raw)
	}
	if cfg := tpl["config"].(map[string]any); cfg["workingDir"] != "/opt/app" || cfg["user"] != "nobody" {
		t.Fatalf("config %v", cfg)
	}

	// Another account: the template is not found, by id or by name.
	if r := s.as(bk, "GET", "/api/templates/"+id, nil); r.Status != 404 {
		t.Fatalf("bob gets alice's template: %d %s", r.Status, r.Raw)
	}
	if r := s.as(bk, "DELETE", "/api/templates/"+id, nil); r.Status != 404 {
		t.Fatalf("bob deletes alice's template: %d %s", r.Status, r.Raw)
	}
	if r := s.as(bk, "POST", "/api/sandboxes", map[string]any{"template": "hello:v1"}); r.Status != 404 {
		t.Fatalf("bob starts alice's template: %d %s", r.Status, r.Raw)
	}
	if r := s.as(bk, "GET", "/api/templates", nil); r.Status != 200 || len(r.Body["templates"].([]any)) != 0 {
		t.Fatalf("bob lists: %d %s", r.Status, r.Raw)
	}

	sb := s.createSandbox(ak, map[string]any{"template": "hello:v1"})
	sid := sb["sandboxId"].(string)
	r = s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "echo $FOO; pwd; id -u; cat hello.txt"}})
	if r.Status != 200 || r.Body["stdout"] != "bar\n/opt/app\n65534\nhello from the image\n" {
		t.Fatalf("exec: %d %s", r.Status, r.Raw)
	}
	// A command that names its directory gets it.
	r = s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "pwd", "cwd": "/tmp"})
	if r.Status != 200 || r.Body["stdout"] != "/tmp\n" {
		t.Fatalf("exec in /tmp: %d %s", r.Status, r.Raw)
	}

	// A run starts there too, as the image's user.
	withRun := s.createSandbox(ak, map[string]any{"template": "hello:v1", "command": "sh", "args": []string{"-c", "pwd; id -u; echo $FOO"}})
	if run := s.waitRun(ak, withRun["runId"].(string), 2*time.Minute); run.Status != "COMPLETED" || run.Output["stdout"] != "/opt/app\n65534\nbar\n" {
		t.Fatalf("run %+v", run)
	}
	s.as(ak, "POST", "/api/sandboxes/"+withRun["sandboxId"].(string)+"/stop", nil)

	// In use: not deleted; once the sandbox stopped, deleted.
	if r := s.as(ak, "DELETE", "/api/templates/"+id, nil); r.Status != 409 {
		t.Fatalf("delete in use: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "DELETE", "/api/templates/"+id, nil); r.Status != 200 {
		t.Fatalf("delete: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "POST", "/api/sandboxes", map[string]any{"template": "hello:v1"}); r.Status != 404 {
		t.Fatalf("create from a deleted template: %d %s", r.Status, r.Raw)
	}
}

// TestTemplateWithSteps: templates from the test image with steps (the
// API's JSON steps, then a Dockerfile) run them in build sandboxes; a
// sandbox from one starts on the image and the steps' layers, with their
// ENV and WORKDIR. A failing RUN fails the build naming the step; a
// rebuild that changes only the last step runs only it.
func TestTemplateWithSteps(t *testing.T) {
	ref := pushImage(t, testRegistry(t), "apps/base:v1", templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}))
	// Build sandboxes get a network (egress): a pool of its own keeps it
	// apart from other servers' on this host (each takes its pool's first
	// addresses).
	s := startServer(t, filepath.Join(t.TempDir(), "templates.db"), "--templates-allow-private-registries", "--network-pool", "10.237.0.0/16")
	alice := s.createAccount("alice", false)
	ak := s.createKey(alice.ID)

	build := func(body map[string]any) map[string]any {
		t.Helper()
		return s.buildTemplate(ak, body)
	}
	check := func(tplName string) {
		t.Helper()
		sb := s.createSandbox(ak, map[string]any{"template": tplName})
		sid := sb["sandboxId"].(string)
		defer s.as(ak, "POST", "/api/sandboxes/"+sid+"/stop", nil)
		r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "cat hi; echo $X; pwd"}})
		if r.Status != 200 || r.Body["stdout"] != "hi\n1\n/opt\n" {
			t.Fatalf("exec in a sandbox of %s: %d %s", tplName, r.Status, r.Raw)
		}
	}
	run := "echo hi > /opt/hi && echo built"
	stepsOf := func(last map[string]any) []map[string]any {
		return []map[string]any{
			{"type": "ENV", "args": []string{"X", "1"}},
			{"type": "RUN", "args": []string{run}},
			last,
		}
	}

	tpl := build(map[string]any{"name": "steps:v1", "image": ref.String(), "steps": stepsOf(map[string]any{"type": "WORKDIR", "args": []string{"/opt"}})})
	log := fmt.Sprint(tpl["log"])
	if tpl["status"] != "ready" || !strings.Contains(log, "step 2/3: RUN "+run) || !strings.Contains(log, "Z built\n") {
		t.Fatalf("steps build: %v", tpl)
	}
	if cfg := tpl["config"].(map[string]any); cfg["workingDir"] != "/opt" || !strings.Contains(fmt.Sprint(cfg["env"]), "X=1") {
		t.Fatalf("config %v", cfg)
	}
	check("steps:v1")

	// The same as a Dockerfile: the same steps, so the same cache keys.
	tpl = build(map[string]any{"name": "df:v1", "dockerfile": "FROM " + ref.String() + "\nENV X=1\nRUN " + run + "\nWORKDIR /opt\n"})
	if tpl["status"] != "ready" || tpl["source"] != ref.String() {
		t.Fatalf("dockerfile build: %v", tpl)
	}
	check("df:v1")

	// Only the last step changed: the RUN before it is cached.
	tpl = build(map[string]any{"name": "steps:v2", "image": ref.String(), "steps": stepsOf(map[string]any{"type": "RUN", "args": []string{"echo again"}})})
	log = fmt.Sprint(tpl["log"])
	if tpl["status"] != "ready" || !strings.Contains(log, "step 2/3: cached") || strings.Contains(log, "Z built\n") || !strings.Contains(log, "Z again\n") {
		t.Fatalf("rebuild: %v", tpl)
	}

	// A start command runs in each sandbox from the template, and the
	// create answers once its ready command passes.
	tpl = build(map[string]any{"name": "srv:v1", "image": ref.String(), "steps": stepsOf(map[string]any{"type": "WORKDIR", "args": []string{"/opt"}}),
		"startCmd": "echo $X > /tmp/started; exec sleep 1000", "readyCmd": "test -s /tmp/started"})
	if tpl["status"] != "ready" || !strings.Contains(fmt.Sprint(tpl["log"]), "finalize: ready after") {
		t.Fatalf("start command build: %v", tpl)
	}
	sb := s.createSandbox(ak, map[string]any{"template": "srv:v1"})
	r := s.as(ak, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "cat /tmp/started; cat hi"}})
	if r.Status != 200 || r.Body["stdout"] != "1\nhi\n" {
		t.Fatalf("exec in a sandbox with a start command: %d %s", r.Status, r.Raw)
	}
	s.as(ak, "POST", "/api/sandboxes/"+sb["sandboxId"].(string)+"/stop", nil)
	tpl = build(map[string]any{"name": "srv:v2", "image": ref.String(), "startCmd": "exit 4", "readyCmd": "false"})
	if tpl["status"] != "failed" || tpl["failureReason"] != "finalize: the start command ended with exit code 4 before the template was ready" {
		t.Fatalf("failing start command: %v", tpl)
	}

	// A failing RUN fails the build, naming the step and the exit code.
	tpl = build(map[string]any{"name": "bad:v1", "image": ref.String(), "steps": []map[string]any{
		{"type": "RUN", "args": []string{"true"}}, {"type": "RUN", "args": []string{"echo failing; exit 7"}}}})
	if tpl["status"] != "failed" || tpl["failureReason"] != "step 2 (RUN echo failing; exit 7) failed with exit code 7" || !strings.Contains(fmt.Sprint(tpl["log"]), "failing") {
		t.Fatalf("failing build: %v", tpl)
	}
}

// templateImage is the test root filesystem as one layer, an app layer
// above it, and cfg.
func templateImage(t *testing.T, cfg v1.Config) v1.Image {
	t.Helper()
	base := tarLayer(t, func(tw *tar.Writer) {
		err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
			if err != nil || path == rootfs {
				return err
			}
			rel, _ := filepath.Rel(rootfs, path)
			fi, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(path); err != nil {
					return err
				}
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name, h.Uid, h.Gid, h.Uname, h.Gname = rel, 0, 0, "", ""
			if fi.IsDir() {
				h.Name += "/"
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.Mode().IsRegular() {
				data, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				_, err = tw.Write(data)
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	app := tarLayer(t, func(tw *tar.Writer) {
		body := "hello from the image\n"
		for _, h := range []*tar.Header{
			{Typeflag: tar.TypeDir, Name: "opt/", Mode: 0o755},
			{Typeflag: tar.TypeDir, Name: "opt/app/", Mode: 0o755},
			{Typeflag: tar.TypeReg, Name: "opt/app/hello.txt", Mode: 0o644, Size: int64(len(body))},
		} {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		io.WriteString(tw, body)
	})
	img, err := mutate.AppendLayers(empty.Image, base, app)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", goruntime.GOARCH, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func tarLayer(t *testing.T, write func(tw *tar.Writer)) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	write(tw)
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return static.NewLayer(buf.Bytes(), types.OCILayer)
}

// testRegistry serves an in-process OCI registry (go-containerregistry's
// implementation of the distribution API, nothing from the internet) on
// loopback for the test, and answers its host:port. Servers pull from it
// with --templates-allow-private-registries.
func testRegistry(t *testing.T) string {
	t.Helper()
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	return strings.TrimPrefix(reg.URL, "http://")
}

// pushImage pushes img to host as repo ("apps/base:v1") and answers its
// reference.
func pushImage(t *testing.T, host, repo string, img v1.Image) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// buildTemplate starts a build through the REST API as k (202 expected)
// and answers the template once its build ended (waitTemplate).
func (s *server) buildTemplate(k key, body map[string]any) map[string]any {
	s.t.Helper()
	r := s.as(k, "POST", "/api/templates", body)
	if r.Status != 202 {
		s.t.Fatalf("build %v: %d %s", body, r.Status, r.Raw)
	}
	return s.waitTemplate(k, r.Body["template"].(map[string]any)["id"].(string))
}

// waitTemplate polls template id as k until its build is no longer
// building (or the read fails), within 3 minutes, and answers it.
func (s *server) waitTemplate(k key, id string) map[string]any {
	s.t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r := s.as(k, "GET", "/api/templates/"+id, nil)
		tpl, _ := r.Body["template"].(map[string]any)
		if r.Status != 200 || tpl["status"] != "building" {
			return tpl
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("still building: %s", r.Raw)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
