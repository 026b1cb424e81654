package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestTemplatePool: a custom template's first create starts cold and gives
// the template a pool (--template-pool); the next create is handed a
// sandbox from it (the metrics count the hit), which is indistinguishable
// from the cold one: the image's environment and WORKDIR, the step's
// layer, the start command run for it, a key of its own. A create of the
// built-in image never gets a template's sandbox.
func TestTemplatePool(t *testing.T) {
	ref := pushImage(t, testRegistry(t), "apps/pooled:v1", templateImage(t, v1.Config{Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "FOO=bar"}, WorkingDir: "/opt/app"}))
	s := startServer(t, filepath.Join(t.TempDir(), "tplpool.db"), "--templates-allow-private-registries",
		"--network-pool", "10.247.0.0/16", "--template-pool", "2")
	alice := s.createAccount("alice", false)
	ak := s.createKey(alice.ID)

	r := s.as(ak, "POST", "/api/templates", map[string]any{"name": "pooled:v1", "image": ref.String(),
		"steps":    []map[string]any{{"type": "RUN", "args": []string{"echo from-the-step > /opt/layer"}}},
		"startCmd": "echo started-$FOO >> /tmp/started; exec sleep 1000", "readyCmd": "test -s /tmp/started"})
	if r.Status != 202 {
		t.Fatalf("build: %d %s", r.Status, r.Raw)
	}
	id := r.Body["template"].(map[string]any)["id"].(string)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r = s.as(ak, "GET", "/api/templates/"+id, nil)
		if tpl := r.Body["template"].(map[string]any); tpl["status"] == "ready" {
			break
		} else if tpl["status"] != "building" || time.Now().After(deadline) {
			t.Fatalf("build: %s", r.Raw)
		}
		time.Sleep(200 * time.Millisecond)
	}

	hits, misses := `sandboxd_pool_total{event="hit",pool="template"}`, `sandboxd_pool_total{event="miss",pool="template"}`
	ready := `sandboxd_pool_ready{pool="template"}`
	// What a sandbox of the template shows of itself; its key is its own.
	const probe = `echo $FOO; pwd; cat /opt/layer; cat /tmp/started; cat hello.txt; test -n "$RECOUP_API_KEY" && echo keyed`
	const want = "bar\n/opt/app\nfrom-the-step\nstarted-bar\nhello from the image\nkeyed\n"
	show := func(sid string) string {
		t.Helper()
		r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", probe}})
		if r.Status != 200 {
			t.Fatalf("exec in %s: %d %s", sid, r.Status, r.Raw)
		}
		return fmt.Sprint(r.Body["stdout"])
	}
	key := func(sid string) string {
		t.Helper()
		r := s.as(ak, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "echo $RECOUP_API_KEY"}})
		return fmt.Sprint(r.Body["stdout"])
	}

	cold := s.createSandbox(ak, map[string]any{"template": "pooled:v1"})["sandboxId"].(string)
	if got := show(cold); got != want {
		t.Fatalf("the cold sandbox shows %q, want %q", got, want)
	}
	if s.prewarmMetric(misses) != 1 || s.prewarmMetric(hits) != 0 {
		t.Fatalf("after the first create: %v misses, %v hits", s.prewarmMetric(misses), s.prewarmMetric(hits))
	}
	waitReady := func() {
		t.Helper()
		until := time.Now().Add(time.Minute)
		for s.prewarmMetric(ready) < 1 {
			if time.Now().After(until) {
				t.Fatal("the template's pool was not filled")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitReady()

	warm := s.createSandbox(ak, map[string]any{"template": "pooled:v1"})["sandboxId"].(string)
	if s.prewarmMetric(hits) != 1 {
		t.Fatalf("the second create was not a pool hit: %v hits, %v misses", s.prewarmMetric(hits), s.prewarmMetric(misses))
	}
	if got := show(warm); got != want {
		t.Fatalf("the pooled sandbox shows %q, the cold one %q", got, want)
	}
	if k1, k2 := key(cold), key(warm); k1 == k2 || k2 == "\n" {
		t.Fatalf("the pooled sandbox's key %q, the cold one's %q", k2, k1)
	}

	// The built-in image's create is not handed the template's sandbox.
	waitReady()
	builtin := s.createSandbox(ak, map[string]any{})["sandboxId"].(string)
	r = s.as(ak, "POST", "/api/sandboxes/"+builtin+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "test -e /opt/layer || echo built-in"}})
	if r.Status != 200 || r.Body["stdout"] != "built-in\n" || s.prewarmMetric(hits) != 1 {
		t.Fatalf("built-in create: %d %s, %v template hits", r.Status, r.Raw, s.prewarmMetric(hits))
	}
	for _, sid := range []string{cold, warm, builtin} {
		s.as(ak, "POST", "/api/sandboxes/"+sid+"/stop", nil)
	}
}
