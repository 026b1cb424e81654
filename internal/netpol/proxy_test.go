package netpol

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestProxyPath(t *testing.T) {
	p := NewProxy(ProxyOptions{Resolve: func(context.Context, string) (netip.Addr, error) { return netip.Addr{}, nil }})
	tests := []struct {
		in   string
		id   string
		port int
		rest string
		ok   bool
	}{
		{"/api/sandboxes/sb1/proxy/3000/", "sb1", 3000, "/", true},
		{"/api/sandboxes/sb1/proxy/3000", "sb1", 3000, "/", true},
		{"/api/sandboxes/sb1/proxy/8080/a/b%2Fc", "sb1", 8080, "/a/b%2Fc", true},
		{"/api/sandboxes/sb1/proxy/0/", "", 0, "", false},
		{"/api/sandboxes/sb1/proxy/65536/", "", 0, "", false},
		{"/api/sandboxes/sb1/proxy/x/", "", 0, "", false},
		{"/api/sandboxes//proxy/80/", "", 0, "", false},
		{"/api/sandboxes/a/b/proxy/80/", "", 0, "", false},
		{"/api/other/sb1/proxy/80/", "", 0, "", false},
	}
	for _, tt := range tests {
		id, port, rest, err := p.parsePath(tt.in)
		if (err == nil) != tt.ok || id != tt.id || port != tt.port || rest != tt.rest {
			t.Errorf("parsePath(%q) = %q, %d, %q, %v", tt.in, id, port, rest, err)
		}
	}
}

// TestProxy serves from inside a sandbox's namespace on port 3000 and
// reaches it through the proxy: plain requests and an upgraded connection.
func TestProxy(t *testing.T) {
	requireRoot(t)
	m := newManager(t, "tnx", "10.209.0.0/16", nil)
	n, err := m.Setup(context.Background(), "sb-proxy", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	l := listenIn(t, n.Netns, netip.AddrPortFrom(n.GuestAddr, 3000).String())
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "echo" {
			c, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			rw.Flush()
			io.Copy(c, rw)
			return
		}
		fmt.Fprintf(w, "path=%s query=%s auth=%q prefix=%s", r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Authorization"), r.Header.Get("X-Forwarded-Prefix"))
	}))
	srv := httptest.NewServer(NewProxy(ProxyOptions{Resolve: func(_ context.Context, id string) (netip.Addr, error) {
		if id != "sb-proxy" {
			return netip.Addr{}, errors.New("no such sandbox")
		}
		return n.GuestAddr, nil
	}}))
	defer srv.Close()

	get := func(path string) (int, string) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer account-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/api/sandboxes/sb-proxy/proxy/3000/app/x%2Fy?q=1")
	want := `path=/app/x%2Fy query=q=1 auth="" prefix=/api/sandboxes/sb-proxy/proxy/3000`
	if code != 200 || body != want {
		t.Errorf("proxied GET = %d %q, want 200 %q", code, body, want)
	}
	if code, _ := get("/api/sandboxes/other/proxy/3000/"); code != 404 {
		t.Errorf("unknown sandbox: %d, want 404", code)
	}
	if code, _ := get("/api/sandboxes/sb-proxy/proxy/3001/"); code != 502 {
		t.Errorf("closed port: %d, want 502", code)
	}

	// An upgraded connection (as a websocket is) passes bytes both ways.
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /api/sandboxes/sb-proxy/proxy/3000/ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	fmt.Fprint(c, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo over the upgraded connection: %q, %v", line, err)
	}
}
