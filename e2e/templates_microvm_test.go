package e2e

import (
	"archive/tar"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestTemplateMicroVM: custom templates on the microVM backend. An image
// the test builds — the test root filesystem, then a layer with a user
// "app" (uid 1000) whose home is its own, the image's program in
// /opt/app/bin with a hard link and a symlink to it, and a config with
// ENV, WORKDIR and USER app — is pushed to an in-process registry and built
// into a template with one RUN step, which runs in a build sandbox that is
// a microVM, as the image's user. A sandbox from the template (a microVM
// booted on the image's base disk and the step's layer) runs the image's
// program with its ENV, in its WORKDIR, as its USER, and has what the step
// made, still the user's. Its start command runs there (checked once at the
// end of the build, in another microVM) before the create answers.
func TestTemplateMicroVM(t *testing.T) {
	if !microVMReady(t) {
		return
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://") + "/apps/vm:v1")
	if err != nil {
		t.Fatal(err)
	}
	img := templateImage(t, v1.Config{
		Env:        []string{"PATH=/opt/app/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hello"},
		WorkingDir: "/opt/app",
		User:       "app",
	})
	if img, err = mutate.AppendLayers(img, appUserLayer(t)); err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	s := startServer(t, filepath.Join(t.TempDir(), "templates.db"), "--runtime", "microvm",
		"--templates-allow-private-registries", "--network-pool", "10.245.0.0/16")
	alice := s.createAccount("alice", false)
	ak := s.createKey(alice.ID)

	step := "greet > /home/app/built && id -u >> /home/app/built && mkdir /home/app/data && echo step in $(pwd)"
	r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "vm:v1", "image": ref.String(),
		"steps":    []map[string]any{{"type": "RUN", "args": []string{step}}},
		"startCmd": "greet > /tmp/started; exec sleep 1000", "readyCmd": "test -s /tmp/started"})
	if r.Status != 202 {
		t.Fatalf("build: %d %s", r.Status, r.Raw)
	}
	id := r.Body["template"].(map[string]any)["id"].(string)
	var tpl map[string]any
	deadline := time.Now().Add(5 * time.Minute)
	for {
		r = s.as(ak, "GET", "/api/templates/"+id, nil)
		if r.Status != 200 {
			t.Fatalf("get: %d %s", r.Status, r.Raw)
		}
		if tpl = r.Body["template"].(map[string]any); tpl["status"] != "building" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still building: %s", r.Raw)
		}
		time.Sleep(250 * time.Millisecond)
	}
	if log := fmt.Sprint(tpl["log"]); tpl["status"] != "ready" || !strings.Contains(log, "step 1/1: RUN "+step) ||
		!strings.Contains(log, "step in /opt/app\n") || !strings.Contains(log, "finalize: ready after") {
		t.Fatalf("build ended %v", tpl)
	}

	sb := s.createSandbox(ak, map[string]any{"template": "vm:v1"})
	sid := sb["sandboxId"].(string)
	defer s.as(ak, "POST", "/api/sandboxes/"+sid+"/stop", nil)
	exec := func(script string) string {
		t.Helper()
		r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
		if r.Status != 200 || r.Body["exitCode"] != 0.0 {
			t.Fatalf("exec %q: %d %s", script, r.Status, r.Raw)
		}
		return fmt.Sprint(r.Body["stdout"])
	}
	// A microVM: its own kernel, not the host's.
	host, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	if inside := exec("cat /proc/version"); strings.TrimSpace(inside) == strings.TrimSpace(string(host)) || !strings.Contains(inside, "sandboxd") {
		t.Fatalf("not in a microVM: %q", inside)
	}
	if got, want := exec("greet; hello; greet2; echo $GREETING; pwd; id -un; id -u"), "hello from app\nhello from app\nhello from app\nhello\n/opt/app\napp\n1000\n"; got != want {
		t.Fatalf("the image's program, ENV, WORKDIR, USER:\n%s\nwant:\n%s", got, want)
	}
	// The start command ran as the image's user before the create answered.
	if got := exec("cat /tmp/started"); got != "hello from app\n" {
		t.Fatalf("start command: %q", got)
	}
	if got, want := exec("cat /home/app/built; stat -c '%U %a' /home/app /home/app/built /home/app/data; cat /home/app/secret"),
		"hello from app\n1000\napp 750\napp 644\napp 755\nmine\n"; got != want {
		t.Fatalf("the step's files:\n%s\nwant:\n%s", got, want)
	}
}

// appUserLayer is an image layer with a user "app" (uid and gid 1000), its
// home (0750, its own, a file only it may read), and a program
// /opt/app/bin/greet with a hard link (greet2) and a symlink to it
// (/usr/local/bin/hello).
func appUserLayer(t *testing.T) v1.Layer {
	t.Helper()
	passwd, err := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	group, err := os.ReadFile(filepath.Join(rootfs, "etc", "group"))
	if err != nil {
		t.Fatal(err)
	}
	files := []struct {
		h    tar.Header
		body string
	}{
		{tar.Header{Typeflag: tar.TypeReg, Name: "etc/passwd", Mode: 0o644}, string(passwd) + "app:x:1000:1000:app:/home/app:/bin/sh\n"},
		{tar.Header{Typeflag: tar.TypeReg, Name: "etc/group", Mode: 0o644}, string(group) + "app:x:1000:\n"},
		{tar.Header{Typeflag: tar.TypeDir, Name: "home/", Mode: 0o755}, ""},
		{tar.Header{Typeflag: tar.TypeDir, Name: "home/app/", Mode: 0o750, Uid: 1000, Gid: 1000}, ""},
		{tar.Header{Typeflag: tar.TypeReg, Name: "home/app/secret", Mode: 0o600, Uid: 1000, Gid: 1000}, "mine\n"},
		{tar.Header{Typeflag: tar.TypeDir, Name: "opt/app/bin/", Mode: 0o755}, ""},
		{tar.Header{Typeflag: tar.TypeReg, Name: "opt/app/bin/greet", Mode: 0o755}, "#!/bin/sh\necho \"hello from $(id -un)\"\n"},
		{tar.Header{Typeflag: tar.TypeLink, Name: "opt/app/bin/greet2", Linkname: "opt/app/bin/greet"}, ""},
		{tar.Header{Typeflag: tar.TypeDir, Name: "usr/local/bin/", Mode: 0o755}, ""},
		{tar.Header{Typeflag: tar.TypeSymlink, Name: "usr/local/bin/hello", Linkname: "../../../opt/app/bin/greet"}, ""},
	}
	return tarLayer(t, func(tw *tar.Writer) {
		for _, f := range files {
			h := f.h
			h.Size = int64(len(f.body))
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(tw, f.body); err != nil {
				t.Fatal(err)
			}
		}
	})
}
