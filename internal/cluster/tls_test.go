package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// pki is one test cluster's CA, able to issue node certificates.
type pki struct {
	t     *testing.T
	ca    *CA
	caPEM []byte
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	ca, iss, err := NewCA(name, time.Now(), DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	return &pki{t: t, ca: ca, caPEM: iss.CertPEM}
}

// node is a node's TLS with a certificate for hosts.
func (p *pki) node(name string, hosts ...string) *TLS {
	p.t.Helper()
	iss, err := p.ca.IssueNode(name, hosts, time.Now(), DefaultNodeValidity)
	if err != nil {
		p.t.Fatal(err)
	}
	conf, err := newTLS(iss.CertPEM, iss.KeyPEM, p.caPEM, time.Now())
	if err != nil {
		p.t.Fatal(err)
	}
	return conf
}

// startTLSHost serves h on loopback behind conf's listener, as serve does
// the cluster listener; it returns the host:port.
func startTLSHost(t *testing.T, conf *TLS, h http.Handler) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = conf.Listener(srv.Listener)
	// The refused handshakes are the point of some tests, not news.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// lockedBuffer is a log both the proxy's goroutines and the test touch.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// signedHost is a node's cluster listener in miniature: it verifies the
// signature, refuses a forwarded key, and answers a stream (the caller's
// body in the first event, the second 200 ms later) or, for a websocket
// upgrade, echoes one message. It notes the client certificate it saw.
func signedHost(t *testing.T, peer *atomic.Value) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := secret.Verify(r, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			peer.Store(r.TLS.PeerCertificates[0].Subject.CommonName)
		}
		if r.Header.Get("x-api-key") != "" || r.Header.Get("Authorization") != "" || strings.Contains(r.Header.Get("Sec-WebSocket-Protocol"), "sandboxd.key.") {
			http.Error(w, "a key was forwarded", http.StatusBadRequest)
			return
		}
		if r.Header.Get("Upgrade") == "websocket" {
			c, err := websocket.Accept(w, r, nil)
			if err != nil {
				t.Errorf("accept websocket: %v", err)
				return
			}
			defer c.CloseNow()
			_, msg, err := c.Read(r.Context())
			if err != nil {
				t.Errorf("read websocket: %v", err)
				return
			}
			_ = c.Write(r.Context(), websocket.MessageText, fmt.Appendf(nil, "%s from %s", msg, f.From))
			_ = c.Close(websocket.StatusNormalClosure, "")
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s %s %v %s\n\n", f.From, f.KeyID, f.Placed, body)
		w.(http.Flusher).Flush()
		time.Sleep(200 * time.Millisecond)
		fmt.Fprint(w, "data: end\n\n")
	})
}

// TestForwardTLS: over mutual TLS a forward reaches the other node signed,
// with the forwarding node's certificate, with its body; a stream comes
// back as it is written; a websocket upgrade passes through.
func TestForwardTLS(t *testing.T) {
	p := newPKI(t, "test cluster")
	var peer atomic.Value
	addr := startTLSHost(t, p.node("n2", "127.0.0.1"), signedHost(t, &peer))
	fw := NewForwarder(secret, "n1", p.node("n1", "127.0.0.1"), slog.New(slog.DiscardHandler))
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw.Forward(w, r, store.Node{ID: "n2", Address: addr}, "key_1", true)
	}))
	defer front.Close()

	req, _ := http.NewRequest("POST", front.URL+"/api/sandboxes/sbx_1/exec", strings.NewReader("hello"))
	req.Header.Set("x-api-key", "secret-user-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	start := time.Now()
	line, _ := br.ReadString('\n')
	if line != "data: n1 key_1 true hello\n" {
		t.Fatalf("first event %q", line)
	}
	if time.Since(start) > 150*time.Millisecond {
		t.Error("the first event came only with the end of the stream: not flushed")
	}
	if rest, _ := io.ReadAll(br); !strings.Contains(string(rest), "data: end") {
		t.Errorf("the stream ended with %q", rest)
	}
	if got, _ := peer.Load().(string); got != "n1" {
		t.Errorf("the host saw the client certificate of %q, want n1's", got)
	}

	// Do, this node's own requests (the MCP tools'), over the same TLS.
	doReq, _ := http.NewRequest("POST", "/api/sandboxes/sbx_1/exec", strings.NewReader("from do"))
	doResp, err := fw.Do(doReq, store.Node{ID: "n2", Address: addr}, "key_2", false)
	if err != nil {
		t.Fatal(err)
	}
	doBody, _ := io.ReadAll(doResp.Body)
	doResp.Body.Close()
	if !strings.HasPrefix(string(doBody), "data: n1 key_2 false from do\n") {
		t.Errorf("Do over TLS: %d %q", doResp.StatusCode, doBody)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(front.URL, "http")+"/api/sandboxes/sbx_1/connect",
		&websocket.DialOptions{Subprotocols: []string{"sandboxd.key.secret-user-key"}})
	if err != nil {
		t.Fatalf("websocket through the forward: %v", err)
	}
	defer c.CloseNow()
	if c.Subprotocol() != "sandboxd.key.secret-user-key" {
		t.Errorf("subprotocol %q, want the key's back", c.Subprotocol())
	}
	if err := c.Write(ctx, websocket.MessageText, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	_, msg, err := c.Read(ctx)
	if err != nil || string(msg) != "ping from n1" {
		t.Fatalf("websocket echo %q, %v", msg, err)
	}
}

// TestTLSRefusesUnauthenticated: with mutual TLS on, the cluster listener
// lets nothing without a certificate of the cluster's CA reach its
// handler: no certificate, another CA's, TLS 1.2, plain HTTP.
func TestTLSRefusesUnauthenticated(t *testing.T) {
	securitytest.Attack(t, "cluster", "a client connects to a node's cluster listener under mutual TLS without a certificate, with one of another CA, with TLS 1.2, or in plain HTTP",
		"refused in the TLS handshake: TLS 1.3 only, a client certificate signed by the cluster's CA required; the handler (and its signature check) is never reached")
	p := newPKI(t, "test cluster")
	var reached atomic.Int32
	addr := startTLSHost(t, p.node("n2", "127.0.0.1"), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
	}))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.caPEM)
	other := newPKI(t, "another cluster").node("intruder", "127.0.0.1")
	get := func(conf *tls.Config) error {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
		resp, err := c.Get("https://" + addr + "/api/health")
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	for name, tc := range map[string]struct {
		conf *tls.Config
		want string
	}{
		"no certificate": {&tls.Config{RootCAs: roots}, "certificate required"},
		// Presented whatever the server asks for (a client that sticks to
		// the CAs the server names would send none).
		"another CA": {&tls.Config{RootCAs: roots, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &other.cert, nil
		}}, "unknown certificate authority"},
		"TLS 1.2": {&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{p.node("old", "127.0.0.1").cert}, MaxVersion: tls.VersionTLS12}, "protocol version"},
	} {
		if err := get(tc.conf); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want a handshake error saying %q", name, err, tc.want)
		}
	}
	resp, err := http.Get("http://" + addr + "/api/health")
	if err == nil {
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP: %s", resp.Status)
		}
		resp.Body.Close()
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the handler was reached %d times", n)
	}
	// And a good certificate does reach it.
	if err := get(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{p.node("n1", "127.0.0.1").cert}}); err != nil || reached.Load() != 1 {
		t.Fatalf("a node's certificate: %v, reached %d", err, reached.Load())
	}
}

// TestForwardTLSMismatch: a forward (and a Do) between nodes that
// disagree on TLS, or to a node whose certificate is not the cluster's or
// does not name its address, fails as an unreachable node does (502; Do:
// an error), with a log line that says why; never in plaintext.
func TestForwardTLSMismatch(t *testing.T) {
	securitytest.Attack(t, "cluster", "a node with mutual TLS forwards to a listener without TLS, with another CA's certificate, or with a certificate for another host",
		"the forward fails (502, logged with the reason) before any request is sent; it never falls back to plain HTTP")
	p := newPKI(t, "test cluster")
	var reached atomic.Int32
	count := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached.Add(1) })
	plain := httptest.NewServer(count)
	defer plain.Close()
	for _, tc := range []struct {
		name    string
		fwTLS   *TLS
		address string
		want    string
	}{
		{"TLS to plain", p.node("n1", "127.0.0.1"), strings.TrimPrefix(plain.URL, "http://"), "does not speak TLS"},
		{"plain to TLS", nil, startTLSHost(t, p.node("n2", "127.0.0.1"), count), "serves TLS and this node forwards in plain HTTP"},
		{"another CA", p.node("n1", "127.0.0.1"), startTLSHost(t, newPKI(t, "other").node("n2", "127.0.0.1"), count), "does not verify against this node's --cluster-tls-ca"},
		{"another host", p.node("n1", "127.0.0.1"), startTLSHost(t, p.node("n2", "node2.internal"), count), "does not name the host of its address"},
	} {
		var logs lockedBuffer
		fw := NewForwarder(secret, "n1", tc.fwTLS, slog.New(slog.NewTextHandler(&logs, nil)))
		rec := httptest.NewRecorder()
		fw.Forward(rec, httptest.NewRequest("POST", "/api/sandboxes/sbx_1/exec", strings.NewReader("secret body")), store.Node{ID: "n2", Address: tc.address}, "key_1", false)
		if rec.Code != http.StatusBadGateway || !strings.Contains(rec.Body.String(), `"error"`) {
			t.Errorf("%s: %d %s, want 502 with a JSON error", tc.name, rec.Code, rec.Body)
		}
		if !strings.Contains(logs.String(), "forward to node failed") || !strings.Contains(logs.String(), tc.want) {
			t.Errorf("%s: log %q does not say %q", tc.name, logs.String(), tc.want)
		}
		// Do fails alike, with an error rather than an answer.
		req, _ := http.NewRequest("GET", "/api/sandboxes/sbx_1/ports", nil)
		if resp, err := fw.Do(req, store.Node{ID: "n2", Address: tc.address}, "key_1", false); err == nil {
			resp.Body.Close()
			t.Errorf("%s: Do answered %d", tc.name, resp.StatusCode)
		}
		if !strings.Contains(logs.String(), "request to node failed") || strings.Count(logs.String(), tc.want) < 2 {
			t.Errorf("%s: Do's log %q does not say %q", tc.name, logs.String(), tc.want)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("a handler was reached %d times", n)
	}
}
