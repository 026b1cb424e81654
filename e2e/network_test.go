package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/netpol"
)

// TestNetwork: a sandbox with a network serves a port through the proxy to
// its account's key only; a sandbox without one has no port to reach; bad
// policies are refused; after a SIGKILL, a restart and stops, nothing of the
// sandboxes' networks stays on the host. (Egress and the deny list are
// tested in internal/netpol against a fake internet in namespaces of the
// test's own.) On both backends: a microVM's guest takes its namespace's
// place on the network.
func TestNetwork(t *testing.T) {
	onBothBackends(t, networkFlow)
}

func networkFlow(t *testing.T, _ string, flags []string) {
	dsn := filepath.Join(t.TempDir(), "net.db")
	s := startServer(t, dsn, append([]string{"--keep-sandboxes=true"}, flags...)...)
	a, b := s.createAccount("web", false), s.createAccount("other", false)
	k, bk := s.createKey(a.ID), s.createKey(b.ID)

	if r := s.as(k, "POST", "/api/sandboxes", map[string]any{"network": "bogus"}); r.Status != 400 || fmt.Sprint(r.Body["missing_fields"]) != "[network]" {
		t.Fatalf("bad policy: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "POST", "/api/sandboxes", map[string]any{"network": map[string]any{"allow": []string{"not an address!"}}}); r.Status != 400 {
		t.Fatalf("bad allow list: %d %s", r.Status, r.Raw)
	}

	web := s.createSandbox(k, map[string]any{"network": map[string]any{"allow": []string{"198.51.100.7"}}})
	id := web["sandboxId"].(string)
	start := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c",
		"mkdir -p /tmp/www && echo hello from the sandbox > /tmp/www/index.html && httpd -p 3000 -h /tmp/www && echo started"}})
	if start.Status != 200 || start.Body["stdout"] != "started\n" {
		t.Fatalf("start httpd: %d %s", start.Status, start.Raw)
	}
	path := "/api/sandboxes/" + id + "/proxy/3000/index.html"
	var got response
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if got = s.as(k, "GET", path, nil); got.Status == 200 {
			break
		}
	}
	if got.Status != 200 || string(got.Raw) != "hello from the sandbox\n" {
		t.Fatalf("proxy with the key: %d %q", got.Status, got.Raw)
	}
	ports := s.as(k, "GET", "/api/sandboxes/"+id+"/ports", nil)
	if ports.Status != 200 || !strings.Contains(string(ports.Raw), `{"port":3000,"url":"/api/sandboxes/`+id+`/proxy/3000/"}`) {
		t.Fatalf("ports: %d %s", ports.Status, ports.Raw)
	}
	if r := s.as(bk, "GET", "/api/sandboxes/"+id+"/ports", nil); r.Status != 404 {
		t.Fatalf("another account's ports: %d", r.Status)
	}
	if r := s.call("GET", path, nil, nil); r.Status != 401 {
		t.Fatalf("proxy without a key: %d", r.Status)
	}
	if r := s.as(bk, "GET", path, nil); r.Status != 404 {
		t.Fatalf("proxy with another account's key: %d", r.Status)
	}
	closed := s.createSandbox(k, map[string]any{})
	if r := s.as(k, "GET", "/api/sandboxes/"+closed["sandboxId"].(string)+"/proxy/3000/", nil); r.Status != 404 {
		t.Fatalf("proxy to a sandbox without a network: %d %s", r.Status, r.Raw)
	}

	// Its traffic is counted (the counts themselves are checked against
	// a fake internet in internal/netpol: this host may route nothing).
	if r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil); r.Status != 200 || !strings.Contains(string(r.Raw), `"network_bytes":{"sent":`) {
		t.Fatalf("traffic of the sandbox: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+closed["sandboxId"].(string), nil); r.Status != 200 || strings.Contains(string(r.Raw), `network_bytes`) {
		t.Fatalf("traffic of a sandbox without a network: %d %s", r.Status, r.Raw)
	}

	// And per account on the metrics listener.
	resp, err := http.Get(s.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `sandboxd_network_sent_bytes_total{account_id="`+a.ID+`"}`) {
		t.Fatalf("no network bytes of account %s in /metrics", a.ID)
	}

	// The policy changes at runtime: validated like the create field,
	// only for the account's own running sandboxes with a network.
	netPath := "/api/sandboxes/" + id + "/network"
	if r := s.as(k, "PATCH", netPath, map[string]any{"network": "bogus"}); r.Status != 400 || fmt.Sprint(r.Body["missing_fields"]) != "[network]" {
		t.Fatalf("PATCH a bad policy: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "PATCH", netPath, map[string]any{}); r.Status != 400 || fmt.Sprint(r.Body["missing_fields"]) != "[network]" {
		t.Fatalf("PATCH without a policy: %d %s", r.Status, r.Raw)
	}
	if r := s.as(bk, "PATCH", netPath, map[string]any{"network": "egress"}); r.Status != 404 {
		t.Fatalf("PATCH another account's sandbox: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "PATCH", "/api/sandboxes/"+closed["sandboxId"].(string)+"/network", map[string]any{"network": "egress"}); r.Status != 400 || !strings.Contains(string(r.Raw), `created with network \"none\"`) {
		t.Fatalf("PATCH a sandbox without a network: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "PATCH", netPath, map[string]any{"network": "egress"}); r.Status != 200 || fmt.Sprint(r.Body["sandbox"].(map[string]any)["network"]) != "egress" {
		t.Fatalf("PATCH egress: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "GET", path, nil); r.Status != 200 {
		t.Fatalf("proxy after the policy change: %d %s", r.Status, r.Raw)
	}

	// Three more sandboxes with networks, then a crash.
	ids := []string{id}
	for range 3 {
		ids = append(ids, s.createSandbox(k, map[string]any{"network": "egress"})["sandboxId"].(string))
	}
	for _, id := range ids {
		if !s.netnsExists(id) {
			t.Fatalf("sandbox %s has no network namespace", id)
		}
	}
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()
	s2 := startServerIn(t, s.dataDir, s.dsn, flags...)
	// Re-attached sandboxes keep their network: the port still answers.
	if r := s2.as(k, "GET", path, nil); r.Status != 200 {
		t.Fatalf("proxy after restart: %d %s", r.Status, r.Raw)
	}
	// The changed policy is the sandbox's after the restart too.
	if r := s2.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil); r.Status != 200 || !strings.Contains(string(r.Raw), `"network":"egress"`) {
		t.Fatalf("policy after restart: %d %s", r.Status, r.Raw)
	}
	if r := s2.as(k, "PATCH", netPath, map[string]any{"network": map[string]any{"allow": []string{"198.51.100.8"}}}); r.Status != 200 || !strings.Contains(string(r.Raw), `"network":{"allow":["198.51.100.8"]}`) {
		t.Fatalf("PATCH an allow list after restart: %d %s", r.Status, r.Raw)
	}
	s2.stopAll(k)
	if r := s2.as(k, "PATCH", netPath, map[string]any{"network": "egress"}); r.Status != 409 {
		t.Fatalf("PATCH a stopped sandbox: %d %s", r.Status, r.Raw)
	}
	for _, id := range ids {
		if s2.netnsExists(id) {
			t.Fatalf("network namespace of stopped sandbox %s is left", id)
		}
		link := s2.netPrefix + netpol.Key(id)
		if _, err := os.Stat("/sys/class/net/" + link); err == nil {
			t.Fatalf("link %s of stopped sandbox %s is left", link, id)
		}
	}
}

func (s *server) netnsExists(id string) bool {
	_, err := os.Stat("/run/netns/" + s.netPrefix + "-" + netpol.Key(id))
	return err == nil
}
