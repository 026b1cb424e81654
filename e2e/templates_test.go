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
	if r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "x", "dockerfile": "FROM scratch"}); r.Status != 400 ||
		!strings.Contains(fmt.Sprint(r.Body["error"]), "dockerfile: not supported yet") {
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
