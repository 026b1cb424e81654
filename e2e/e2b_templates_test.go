package e2e

import (
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestE2BTemplateFromImage: a template built from an image (the
// in-process registry of TestTemplateFromImage) is started through E2B's
// REST create with the body the JS SDK's Sandbox.create('hello') sends,
// and its files are read through envd's /files as the SDK reads them;
// GET /templates lists it in E2B's shape, and another account's create
// of the name is E2B's 404.
func TestE2BTemplateFromImage(t *testing.T) {
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(reg.URL, "http://") + "/apps/hello:v1")
	if err != nil {
		t.Fatal(err)
	}
	img := templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FOO=bar"}, WorkingDir: "/opt/app"})
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, filepath.Join(t.TempDir(), "e2b-templates.db"), "--templates-allow-private-registries")
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)

	r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "hello", "image": ref.String()})
	if r.Status != 202 {
		t.Fatalf("build: %d %s", r.Status, r.Raw)
	}
	id := r.Body["template"].(map[string]any)["id"].(string)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		r = s.as(ak, "GET", "/api/templates/"+id, nil)
		if st := r.Body["template"].(map[string]any)["status"]; st == "ready" {
			break
		} else if st != "building" || time.Now().After(deadline) {
			t.Fatalf("build: %s", r.Raw)
		}
	}

	do := func(k key, method, path string, headers map[string]string, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", k.Key)
		req.Header.Set("Content-Type", "application/json")
		for h, v := range headers {
			req.Header.Set(h, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	code, body := do(ak, "GET", "/templates", nil, "")
	var list []struct {
		TemplateID, BuildStatus string
		Aliases                 []string
	}
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list) < 2 {
		t.Fatalf("GET /templates: %d %s", code, body)
	}
	if last := list[len(list)-1]; last.TemplateID != id || last.BuildStatus != "ready" || strings.Join(last.Aliases, ",") != "hello:latest,hello" {
		t.Fatalf("GET /templates: %s", body)
	}

	// The JS SDK's Sandbox.create('hello', {envs: {A: "1"}}).
	sdkBody := `{"templateID":"hello","metadata":{},"envVars":{"A":"1"},"timeout":300,"secure":true,"allow_internet_access":true,"autoPause":false}`
	if code, body := do(bk, "POST", "/sandboxes", nil, sdkBody); code != 404 || !strings.Contains(body, `"code":404`) {
		t.Fatalf("bob starts alice's template: %d %s", code, body)
	}
	code, body = do(ak, "POST", "/sandboxes", nil, sdkBody)
	var created struct{ SandboxID, TemplateID, EnvdAccessToken string }
	if code != 201 || json.Unmarshal([]byte(body), &created) != nil || created.TemplateID != "hello" {
		t.Fatalf("create from the template: %d %s", code, body)
	}
	agent := map[string]string{"E2b-Sandbox-Id": created.SandboxID, "X-Access-Token": created.EnvdAccessToken}
	if code, body := do(ak, "GET", "/files?path=/opt/app/hello.txt", agent, ""); code != 200 || body != "hello from the image\n" {
		t.Fatalf("read the image's file through envd: %d %q", code, body)
	}
	sid := strings.Replace(created.SandboxID, "sbx-", "sbx_", 1)
	r = s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "echo $FOO; pwd"}})
	if r.Status != 200 || r.Body["stdout"] != "bar\n/opt/app\n" {
		t.Fatalf("exec: %d %s", r.Status, r.Raw)
	}
	if code, body := do(ak, "DELETE", "/sandboxes/"+created.SandboxID, nil, ""); code != 204 {
		t.Fatalf("kill: %d %s", code, body)
	}
}
