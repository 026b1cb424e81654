package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestE2BHosts: with --e2b-domain, PORT-ID.DOMAIN reaches a server in the
// sandbox (what the SDKs' getHost names), public unless the sandbox was
// created with allowPublicTraffic false; the E2B sandbox is an ordinary
// sandbox, so sandboxd's own API runs the server in it. On both backends:
// E2B's network options give a microVM its network as they do a gVisor
// sandbox.
func TestE2BHosts(t *testing.T) {
	onBothBackends(t, e2bHostsFlow)
}

func e2bHostsFlow(t *testing.T, _ string, flags []string) {
	s := startServer(t, filepath.Join(t.TempDir(), "hosts.db"), append([]string{"--e2b-domain", "sbx.test"}, flags...)...)
	a := s.createAccount("hosts", false)
	k := s.createKey(a.ID)
	var ek key
	s.admin(&ek, "admin", "key", "create", "--account", a.ID, "--format", "e2b", "--json")

	type created struct {
		SandboxID, Domain  string
		TrafficAccessToken *string
	}
	create := func(network map[string]any) created {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"templateID": "base", "timeout": 120, "network": network})
		req, _ := http.NewRequest("POST", s.base+"/v2/sandboxes", strings.NewReader(string(body)))
		req.Header.Set("X-API-Key", ek.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var c created
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != 201 {
			t.Fatalf("E2B create: %d %v", resp.StatusCode, err)
		}
		if c.Domain != "sbx.test" {
			t.Fatalf("E2B create answered domain %q, want sbx.test", c.Domain)
		}
		// sandboxd's own API knows it by its own form of the id.
		id := strings.Replace(c.SandboxID, "sbx-", "sbx_", 1)
		start := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c",
			"mkdir -p /tmp/www && echo hello from " + c.SandboxID + " > /tmp/www/index.html && httpd -p 3000 -h /tmp/www && echo started"}})
		if start.Status != 200 || start.Body["stdout"] != "started\n" {
			t.Fatalf("start httpd: %d %s", start.Status, start.Raw)
		}
		return c
	}
	getPort := func(c created, port int, headers map[string]string) (int, string) {
		t.Helper()
		var code int
		var body string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			req, _ := http.NewRequest("GET", s.base+"/index.html", nil)
			req.Host = strconv.Itoa(port) + "-" + c.SandboxID + "." + c.Domain
			for h, v := range headers {
				req.Header.Set(h, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if code, body = resp.StatusCode, string(b); code != http.StatusBadGateway {
				break // 502 while httpd starts
			}
		}
		return code, body
	}
	get := func(c created, headers map[string]string) (int, string) {
		t.Helper()
		return getPort(c, 3000, headers)
	}
	allow := []string{"198.51.100.7"}
	public := create(map[string]any{"allowOut": allow})
	if code, body := get(public, nil); code != 200 || body != "hello from "+public.SandboxID+"\n" {
		t.Fatalf("a public port through its host: %d %q", code, body)
	}
	private := create(map[string]any{"allowOut": allow, "allowPublicTraffic": false})
	if private.TrafficAccessToken == nil {
		t.Fatal("a sandbox without public traffic got no traffic token")
	}
	if code, _ := get(private, nil); code != http.StatusForbidden {
		t.Fatalf("a private port without its token: %d, want 403", code)
	}
	if code, body := get(private, map[string]string{"E2b-Traffic-Access-Token": *private.TrafficAccessToken}); code != 200 || body != "hello from "+private.SandboxID+"\n" {
		t.Fatalf("a private port with its token: %d %q", code, body)
	}
	homeRoutesNoPorts(t, s, k, "3000-"+public.SandboxID+"."+public.Domain)

	// After pause and connect (a resume), the resumed sandbox's ports
	// answer through its host: the server that was running, and one
	// started after the resume.
	e2bCall := func(path string, body map[string]any, want ...int) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", s.base+path, strings.NewReader(string(b)))
		req.Header.Set("X-API-Key", ek.Key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, w := range want {
			if resp.StatusCode == w {
				return
			}
		}
		t.Fatalf("POST %s: %d %s, want %v", path, resp.StatusCode, rb, want)
	}
	e2bCall("/sandboxes/"+public.SandboxID+"/pause", nil, http.StatusNoContent)
	e2bCall("/sandboxes/"+public.SandboxID+"/connect", map[string]any{"timeout": 120}, http.StatusOK, http.StatusCreated)
	if code, body := get(public, nil); code != 200 || body != "hello from "+public.SandboxID+"\n" {
		t.Fatalf("a port after pause and resume: %d %q", code, body)
	}
	id := strings.Replace(public.SandboxID, "sbx-", "sbx_", 1)
	if out := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c",
		"mkdir -p /tmp/www2 && echo after the resume > /tmp/www2/index.html && httpd -p 3001 -h /tmp/www2 && echo started"}}); out.Status != 200 || out.Body["stdout"] != "started\n" {
		t.Fatalf("start a server after the resume: %d %s", out.Status, out.Raw)
	}
	code, body := getPort(public, 3001, nil)
	if code != 200 || body != "after the resume\n" {
		t.Fatalf("a server started after the resume: %d %q", code, body)
	}

	// A port nothing answers on, and the ports of a killed sandbox: E2B's
	// edge's answers, with the sandbox's id.
	answer := func(port int) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", s.base+"/", nil)
		req.Host = strconv.Itoa(port) + "-" + public.SandboxID + "." + public.Domain
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, b := answer(3999); code != http.StatusBadGateway || b != `{"sandboxId":"`+public.SandboxID+`","message":"The sandbox is running but port is not open","port":3999,"code":502}` {
		t.Fatalf("a closed port: %d %s", code, b)
	}
	del, _ := http.NewRequest("DELETE", s.base+"/sandboxes/"+public.SandboxID, nil)
	del.Header.Set("X-API-Key", ek.Key)
	if resp, err := http.DefaultClient.Do(del); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("kill: %v %v", resp, err)
	}
	if code, b := answer(3000); code != http.StatusBadGateway || b != `{"sandboxId":"`+public.SandboxID+`","message":"The sandbox was not found","code":502}` {
		t.Fatalf("a killed sandbox's port: %d %s", code, b)
	}
}

// homeRoutesNoPorts: from inside a sandbox with no network,
// sandboxd.internal leads to this server's API and nothing else: a request
// there naming another sandbox's port host (PORT-ID.DOMAIN) is not routed
// to that port, which would give a sandbox without a network another
// account's servers and, through a sandbox with one, the internet.
func homeRoutesNoPorts(t *testing.T, s *server, k key, portHost string) {
	securitytest.Attack(t, "network", "code in a sandbox with network none sends Host: 3000-<another sandbox>.<E2B domain> to http://sandboxd.internal, hoping to reach that sandbox's public port (and through it, the internet)",
		"sandboxd.internal serves only the API, git, MCP and the model proxy: 404, and the other sandbox's server is never reached")
	id := s.createSandbox(k, map[string]any{"network": "none"})["sandboxId"].(string)
	// A request written by hand (busybox nc) to sandboxd.internal, which
	// is 127.0.0.1 (/etc/hosts), where the agent takes the connection home.
	// nc's input stays open until the answer has come: a client that
	// shuts its side at once has its request cancelled by the server
	// before an answer that takes a moment (Go's HTTP server reads the
	// half-close as the client going away).
	out := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c",
		"grep -q '^127.0.0.1.*sandboxd.internal' /etc/hosts || echo 'sandboxd.internal is not 127.0.0.1'; " +
			"(printf 'GET /index.html HTTP/1.1\\r\\nHost: " + portHost + "\\r\\nConnection: close\\r\\n\\r\\n'; sleep 5) | nc -w 20 127.0.0.1 80 2>&1; true"}})
	stdout, _ := out.Body["stdout"].(string)
	if out.Status != 200 || !strings.Contains(stdout, "404 Not Found") || strings.Contains(stdout, "hello from") {
		t.Fatalf("a port host through sandboxd.internal: %d %s, want 404 and not the other sandbox's page", out.Status, out.Raw)
	}
}
