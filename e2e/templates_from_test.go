package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestTemplateFrom: the two sources of templates that
// are not an image. B is built over A (fromTemplate) with a RUN: a sandbox
// from B has A's files and B's, A's ENV and WORKDIR. A running sandbox of
// B writes a file and is saved as C: a sandbox from C has all three. A
// sandbox on the built-in image, started from the account's snapshot,
// is saved as D: a sandbox from D has the snapshot's file and its own.
// Another account can neither build over A nor save alice's sandbox;
// deleting A leaves B and C working.
func TestTemplateFrom(t *testing.T) {
	ref := pushImage(t, testRegistry(t), "apps/base:v1", templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}))
	s := startServer(t, filepath.Join(t.TempDir(), "templates-from.db"), "--templates-allow-private-registries", "--network-pool", "10.241.0.0/16")
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)

	build := func(body map[string]any) map[string]any {
		t.Helper()
		return s.buildTemplate(ak, body)
	}
	exec := func(sid, script string) string {
		t.Helper()
		r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
		if r.Status != 200 {
			t.Fatalf("exec %q in %s: %d %s", script, sid, r.Status, r.Raw)
		}
		out, _ := r.Body["stdout"].(string)
		errOut, _ := r.Body["stderr"].(string)
		return out + errOut
	}
	save := func(k key, sid, tplName string) (int, map[string]any, string) {
		t.Helper()
		r := s.as(k, "POST", "/api/sandboxes/"+sid+"/template", map[string]any{"name": tplName})
		tpl, _ := r.Body["template"].(map[string]any)
		return r.Status, tpl, string(r.Raw)
	}

	a := build(map[string]any{"name": "a:v1", "image": ref.String(), "steps": []map[string]any{
		{"type": "ENV", "args": []string{"X", "1"}},
		{"type": "RUN", "args": []string{"echo a > /opt/a"}},
		{"type": "WORKDIR", "args": []string{"/opt"}},
	}})
	if a["status"] != "ready" {
		t.Fatalf("a: %v", a)
	}

	// B over A, by name, with a RUN that sees A's file.
	b := build(map[string]any{"name": "b:v1", "fromTemplate": "a:v1", "steps": []map[string]any{
		{"type": "RUN", "args": []string{"cat /opt/a > /opt/b && echo b >> /opt/b"}},
	}})
	if b["status"] != "ready" || b["digest"] != a["digest"] || b["source"] != "template:a:v1" || !strings.Contains(fmt.Sprint(b["log"]), "over template a:v1") {
		t.Fatalf("b: %v", b)
	}
	if cfg := b["config"].(map[string]any); cfg["workingDir"] != "/opt" || !strings.Contains(fmt.Sprint(cfg["env"]), "X=1") {
		t.Fatalf("b's config %v", cfg)
	}
	sbB := s.createSandbox(ak, map[string]any{"template": "b:v1"})["sandboxId"].(string)
	if out := exec(sbB, "cat a b; echo $X; pwd"); out != "a\na\nb\n1\n/opt\n" {
		t.Fatalf("a sandbox of b sees %q", out)
	}

	// Bob can neither build over alice's template nor save her sandbox.
	for _, parent := range []string{"a:v1", a["id"].(string)} {
		if r := s.as(bk, "POST", "/api/templates", map[string]any{"name": "mine", "fromTemplate": parent}); r.Status != 404 {
			t.Fatalf("bob over alice's %s: %d %s", parent, r.Status, r.Raw)
		}
	}
	if code, _, raw := save(bk, sbB, "mine"); code != 404 {
		t.Fatalf("bob saves alice's sandbox: %d %s", code, raw)
	}

	// C: B's sandbox with a file written since it started.
	exec(sbB, "echo c > /opt/c")
	code, c, raw := save(ak, sbB, "c:v1")
	if code != 200 || c["status"] != "ready" || c["digest"] != a["digest"] || c["source"] != "sandbox:"+sbB {
		t.Fatalf("save c: %d %s", code, raw)
	}
	if code, _, raw := save(ak, sbB, "c:v1"); code != 409 {
		t.Fatalf("save c again: %d %s", code, raw)
	}
	sbC := s.createSandbox(ak, map[string]any{"template": "c:v1"})["sandboxId"].(string)
	if out := exec(sbC, "cat a b c; echo $X; pwd"); out != "a\na\nb\nc\n1\n/opt\n" {
		t.Fatalf("a sandbox of c sees %q", out)
	}

	// The same through the CLI: over a template (following the build),
	// and from the running sandbox (answered ready).
	cli := func(args ...string) map[string]any {
		t.Helper()
		r := runCLI(t, nil, nil, append([]string{"template", "--url", s.base, "--key", ak.Key, "--json"}, args...)...)
		var out map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
			t.Fatalf("sandboxd template %v: %d\n%s\n%s", args, r.code, r.stdout, r.stderr)
		}
		return out
	}
	if e := cli("build", "e:v1", "--from-template", "a:v1", "--wait"); e["status"] != "ready" || e["source"] != "template:a:v1" {
		t.Fatalf("cli build --from-template: %v", e)
	}
	if f := cli("build", "f:v1", "--from-sandbox", sbB); f["status"] != "ready" || f["source"] != "sandbox:"+sbB {
		t.Fatalf("cli build --from-sandbox: %v", f)
	}

	// D: a sandbox on the built-in image, started from the account's
	// snapshot (a run's), with a file of its own.
	first := s.createSandbox(ak, map[string]any{"command": "sh", "args": []string{"-c", "mkdir -p /data && echo one > /data/one"}})
	if run := s.waitRun(ak, first["runId"].(string), 2*time.Minute); run.Status != "COMPLETED" || run.Output["snapshotId"] == nil {
		t.Fatalf("first run %+v", run)
	}
	s.as(ak, "POST", "/api/sandboxes/"+first["sandboxId"].(string)+"/stop", nil)
	sbOn := s.createSandbox(ak, map[string]any{})["sandboxId"].(string)
	if out := exec(sbOn, "cat /data/one && echo two > /data/two"); out != "one\n" {
		t.Fatalf("the snapshot's file: %q", out)
	}
	code, d, raw := save(ak, sbOn, "d")
	if code != 200 || d["status"] != "ready" || !strings.HasPrefix(fmt.Sprint(d["digest"]), "builtin:") {
		t.Fatalf("save d: %d %s", code, raw)
	}
	sbD := s.createSandbox(ak, map[string]any{"template": "d"})["sandboxId"].(string)
	if out := exec(sbD, "cat /data/one /data/two"); out != "one\ntwo\n" {
		t.Fatalf("a sandbox of d sees %q", out)
	}

	// A goes while B and C (and their sandboxes) stay; a new sandbox of
	// C still starts.
	for _, sid := range []string{sbB, sbC, sbD, sbOn} {
		s.as(ak, "POST", "/api/sandboxes/"+sid+"/stop", nil)
	}
	if r := s.as(ak, "DELETE", "/api/templates/"+a["id"].(string), nil); r.Status != 200 {
		t.Fatalf("delete a: %d %s", r.Status, r.Raw)
	}
	sbC2 := s.createSandbox(ak, map[string]any{"template": "c:v1"})["sandboxId"].(string)
	if out := exec(sbC2, "cat a b c"); out != "a\na\nb\nc\n" {
		t.Fatalf("a sandbox of c after a's delete sees %q", out)
	}
	s.as(ak, "POST", "/api/sandboxes/"+sbC2+"/stop", nil)
}
