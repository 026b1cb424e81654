package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestE2BTemplateBuild: E2B's Template API with the bodies the JS SDK's
// Template.build(Template().fromImage(REF).runCmd('echo hi > /opt/hi'),
// {alias: 'x'}) sends (docs/design/e2b-template-wire.md): the request,
// the start, the status polled with logsOffset until ready and no more
// entries; then Sandbox.create('x') starts it and the file is there.
// Another account's key finds none of it; COPY's upload route refuses a
// hash that is not a SHA-256 (the upload flow: templates_copy_test.go).
func TestE2BTemplateBuild(t *testing.T) {
	ref := pushImage(t, testRegistry(t), "apps/base:v1", templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}))
	s := startServer(t, filepath.Join(t.TempDir(), "e2b-build.db"), "--templates-allow-private-registries", "--network-pool", "10.238.0.0/16")
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)
	do := func(k key, method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", k.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if code, body := do(ak, "GET", "/templates/aliases/x", ""); code != 404 {
		t.Fatalf("alias before the build: %d %s", code, body)
	}
	code, body := do(ak, "POST", "/v3/templates", `{"name":"x","cpuCount":2,"memoryMB":1024}`)
	var req struct {
		TemplateID, BuildID string
		Tags                []string
	}
	if code != 202 || json.Unmarshal([]byte(body), &req) != nil || req.TemplateID == "" || req.BuildID == "" {
		t.Fatalf("POST /v3/templates: %d %s", code, body)
	}
	start := fmt.Sprintf(`{"fromImage":%q,"force":false,"steps":[{"type":"RUN","args":["echo hi > /opt/hi"],"force":false}]}`, ref.String())
	if code, body := do(ak, "POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, start); code != 202 {
		t.Fatalf("start the build: %d %s", code, body)
	}
	if code, body := do(bk, "GET", "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status?logsOffset=0", ""); code != 404 {
		t.Fatalf("bob reads alice's build: %d %s", code, body)
	}

	// waitForBuildFinish: poll, adding the entries received to the offset,
	// while building or waiting; then until a call returns none.
	offset, lines := 0, []string{}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		code, body := do(ak, "GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", req.TemplateID, req.BuildID, offset), "")
		var st struct {
			Status     string
			LogEntries []struct{ Timestamp, Level, Message string }
			Reason     *struct{ Message string }
		}
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil {
			t.Fatalf("status: %d %s", code, body)
		}
		for _, e := range st.LogEntries {
			lines = append(lines, e.Message)
		}
		offset += len(st.LogEntries)
		if st.Status == "error" {
			t.Fatalf("build failed: %s\n%s", body, strings.Join(lines, "\n"))
		}
		if st.Status == "ready" && len(st.LogEntries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s: %s", st.Status, strings.Join(lines, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if log := strings.Join(lines, "\n"); !strings.Contains(log, "RUN echo hi > /opt/hi") {
		t.Errorf("build log: %s", log)
	}
	if code, body := do(ak, "GET", "/templates/aliases/x", ""); code != 200 || !strings.Contains(body, `"templateID":"x"`) {
		t.Fatalf("alias after the build: %d %s", code, body)
	}
	if code, body := do(bk, "GET", "/templates/aliases/x", ""); code != 404 {
		t.Fatalf("bob's alias x: %d %s", code, body)
	}
	if code, body := do(ak, "GET", "/templates/x/files/0123abcd", ""); code != 400 || !strings.Contains(body, "not 64 lower-case hex digits") {
		t.Fatalf("COPY's upload link: %d %s", code, body)
	}

	// Sandbox.create('x'), then the file (read by exec: commands.run is
	// envd's Connect protocol, which the JS SDK tests cover).
	code, body = do(ak, "POST", "/sandboxes", `{"templateID":"x","metadata":{},"envVars":{},"timeout":300,"secure":true,"allow_internet_access":true,"autoPause":false}`)
	var created struct{ SandboxID string }
	if code != 201 || json.Unmarshal([]byte(body), &created) != nil {
		t.Fatalf("create from x: %d %s", code, body)
	}
	defer do(ak, "DELETE", "/sandboxes/"+created.SandboxID, "")
	sid := strings.Replace(created.SandboxID, "sbx-", "sbx_", 1)
	r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "cat", "args": []string{"/opt/hi"}})
	if r.Status != 200 || r.Body["stdout"] != "hi\n" {
		t.Fatalf("cat /opt/hi: %d %s", r.Status, r.Raw)
	}
}
