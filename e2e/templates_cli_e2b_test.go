package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestTemplateCLIAndE2B: a template built from an image (the in-process
// registry of TestTemplateFromImage) with the CLI (build --wait, logs, ls,
// sandbox create --template, rm) is started through E2B's REST create with the body the JS SDK's Sandbox.create('hello') sends,
// and its files are read through envd's /files as the SDK reads them;
// GET /templates lists it in E2B's shape, and another account's create
// of the name is E2B's 404.
func TestTemplateCLIAndE2B(t *testing.T) {
	ref := pushImage(t, testRegistry(t), "apps/hello:v1", templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FOO=bar"}, WorkingDir: "/opt/app"}))
	s := startServer(t, filepath.Join(t.TempDir(), "e2b-templates.db"), "--templates-allow-private-registries")
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)

	// Built with the CLI, which follows the build to its end.
	cli := func(args ...string) cliResult {
		t.Helper()
		return runCLI(t, nil, nil, append([]string{args[0], "--url", s.base, "--key", ak.Key}, args[1:]...)...)
	}
	res := cli("template", "build", "hello", "--image", ref.String(), "--wait", "--json")
	var built struct{ ID, Status string }
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &built) != nil || built.Status != "ready" || !strings.Contains(res.stderr, "ready: ") {
		t.Fatalf("template build --wait: %d %s %s", res.code, res.stdout, res.stderr)
	}
	id := built.ID
	if res := cli("template", "logs", "hello"); res.code != 0 || !strings.Contains(res.stdout, "ready: ") {
		t.Fatalf("template logs: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if res := cli("template", "ls"); res.code != 0 || !strings.Contains(res.stdout, id) || !strings.Contains(res.stdout, "hello:latest") {
		t.Fatalf("template ls: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if res := cli("template", "build", "hello", "--image", ref.String(), "--json"); res.code == 0 || !strings.Contains(res.stderr, `"status":409`) {
		t.Fatalf("a second build of hello: %d %s %s", res.code, res.stdout, res.stderr)
	}
	res = cli("sandbox", "create", "--template", "hello", "--wait", "--", "cat", "hello.txt")
	if res.code != 0 || !strings.Contains(res.stdout, "running") {
		t.Fatalf("sandbox create --template: %d %s %s", res.code, res.stdout, res.stderr)
	}
	cliSandbox := strings.Fields(strings.Split(res.stdout, "\n")[1])[0]

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
	r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "echo $FOO; pwd"}})
	if r.Status != 200 || r.Body["stdout"] != "bar\n/opt/app\n" {
		t.Fatalf("exec: %d %s", r.Status, r.Raw)
	}
	if code, body := do(ak, "DELETE", "/sandboxes/"+created.SandboxID, nil, ""); code != 204 {
		t.Fatalf("kill: %d %s", code, body)
	}

	// In use by the CLI's sandbox: not deleted; once it stopped, deleted.
	if res := cli("template", "rm", "hello"); res.code != 1 || !strings.Contains(res.stderr, "409") {
		t.Fatalf("template rm in use: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if res := cli("sandbox", "stop", cliSandbox); res.code != 0 {
		t.Fatalf("sandbox stop: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if res := cli("template", "rm", "hello"); res.code != 0 || res.stdout != id+"\n" {
		t.Fatalf("template rm: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if code, body := do(ak, "POST", "/sandboxes", nil, sdkBody); code != 404 {
		t.Fatalf("E2B create of a deleted template: %d %s", code, body)
	}
}
