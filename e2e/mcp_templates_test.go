package e2e

import (
	"fmt"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestMCPTemplates: the MCP template tools against a real server and an
// in-process registry on loopback. build_template of a Dockerfile with a
// RUN waits for its build with progress notifications and answers it
// ready with its log; get_template finds it by name, list_templates by
// status; run_command starts a sandbox from it that has the step's file;
// delete_template is refused while that sandbox runs and done once it
// stopped. A RUN that fails makes a waited build an error result saying
// which step; another account finds nothing.
func TestMCPTemplates(t *testing.T) {
	ref := pushImage(t, testRegistry(t), "apps/base:v1", templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FOO=bar"}}))
	// Build sandboxes get a network: a pool of its own.
	s := startServer(t, "", "--templates-allow-private-registries", "--network-pool", "10.248.0.0/16")
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)
	a, b := s.mcpConnect(ak), s.mcpConnect(bk)

	dockerfile := "FROM " + ref.String() + "\nRUN echo built-$((6*7)); echo $((6*7)) > /opt/built; sleep 2\nWORKDIR /opt\n"
	r := a.call(t, "build_template", map[string]any{"name": "tools:v1", "dockerfile": dockerfile, "wait": true}, "build")
	if r.IsError || dig(r.Data, "finished") != true || dig(r.Data, "template", "status") != "ready" ||
		!strings.Contains(fmt.Sprint(dig(r.Data, "template", "log")), "built-42") {
		t.Fatalf("build_template: %s", r.Text)
	}
	id := fmt.Sprint(dig(r.Data, "template", "id"))
	progress := a.progressOf("build")
	if len(progress) == 0 || !strings.HasPrefix(progress[0], "tools:v1 is building after ") {
		t.Fatalf("progress while it built: %q", progress)
	}

	r = a.call(t, "get_template", map[string]any{"template": "tools:v1", "log_lines": 3}, "")
	if r.IsError || dig(r.Data, "template", "id") != id || dig(r.Data, "template", "config", "workingDir") != "/opt" ||
		strings.Count(fmt.Sprint(dig(r.Data, "template", "log")), "\n") != 3 || !strings.Contains(r.Note(), "last 3 of") {
		t.Fatalf("get_template: %s", r.Text)
	}
	if r := a.call(t, "list_templates", map[string]any{"status": "ready"}, ""); r.IsError || !strings.Contains(r.Text, id) {
		t.Fatalf("list_templates: %s", r.Text)
	}
	for _, tool := range []string{"get_template", "delete_template"} {
		if r := b.call(t, tool, map[string]any{"template": id}, ""); !r.IsError || r.Text != "Template not found" || dig(r.Data, "statusCode") != 404.0 {
			t.Fatalf("bob's %s: %+v", tool, r)
		}
	}
	if r := b.call(t, "list_templates", nil, ""); r.IsError || strings.Contains(r.Text, id) {
		t.Fatalf("bob lists: %s", r.Text)
	}

	// A sandbox from it has the step's file, in its WORKDIR.
	r = a.call(t, "run_command", map[string]any{"command": "sh", "args": []string{"-c", "cat built; pwd; echo $FOO"}, "template": "tools:v1"}, "")
	if r.IsError || dig(r.Data, "run", "output", "stdout") != "42\n/opt\nbar\n" {
		t.Fatalf("run_command from the template: %s", r.Text)
	}
	sandboxID := fmt.Sprint(dig(r.Data, "sandbox", "sandboxId"))

	if r := a.call(t, "delete_template", map[string]any{"template": "tools:v1"}, ""); !r.IsError || dig(r.Data, "statusCode") != 409.0 || !strings.Contains(r.Text, "in use") {
		t.Fatalf("delete in use: %+v", r)
	}
	if r := a.call(t, "stop_sandbox", map[string]any{"sandbox_id": sandboxID}, ""); r.IsError {
		t.Fatalf("stop_sandbox: %s", r.Text)
	}
	if r := a.call(t, "delete_template", map[string]any{"template": "tools:v1"}, ""); r.IsError || dig(r.Data, "template", "id") != id {
		t.Fatalf("delete_template: %s", r.Text)
	}
	if r := s.as(ak, "GET", "/api/templates/"+id, nil); r.Status != 404 {
		t.Fatalf("deleted template: %d %s", r.Status, r.Raw)
	}

	// A failing step: a waited build is an error result naming it.
	r = a.call(t, "build_template", map[string]any{"name": "bad:v1", "image": ref.String(),
		"steps": []map[string]any{{"type": "RUN", "args": []string{"exit 3"}}}, "wait": true}, "")
	if !r.IsError || dig(r.Data, "template", "status") != "failed" ||
		!strings.HasPrefix(r.Text, "The build of bad:v1 failed: step 1 (RUN exit 3) failed with exit code 3") {
		t.Fatalf("failing build: %+v", r)
	}
}
