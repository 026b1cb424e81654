package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

var secret = Secret(strings.Repeat("s", 32))

func TestSignVerify(t *testing.T) {
	securitytest.Attack(t, "cluster", "a request to a node's cluster listener forged, altered, replayed late or signed with another secret",
		"refused: the HMAC covers the method, URI, node, key id, placement and time; the time must be within 30 s")
	now := time.Now()
	signed := func() *http.Request {
		r := httptest.NewRequest("POST", "/api/sandboxes/sbx_1/exec?x=1", nil)
		secret.Sign(r, Forward{From: "n1", KeyID: "key_1"}, now)
		return r
	}
	if f, err := secret.Verify(signed(), now.Add(time.Second)); err != nil || f != (Forward{From: "n1", KeyID: "key_1"}) {
		t.Fatalf("a good signature: %+v %v", f, err)
	}
	if _, err := secret.Verify(httptest.NewRequest("GET", "/", nil), now); !errors.Is(err, ErrNotForwarded) {
		t.Fatalf("no headers: %v", err)
	}
	for name, tamper := range map[string]func(r *http.Request){
		"key id":    func(r *http.Request) { r.Header.Set(HeaderKeyID, "key_2") },
		"node":      func(r *http.Request) { r.Header.Set(HeaderNode, "n2") },
		"placed":    func(r *http.Request) { r.Header.Set(HeaderPlaced, "1") },
		"path":      func(r *http.Request) { r.URL.Path = "/api/sandboxes/sbx_2/exec" },
		"query":     func(r *http.Request) { r.URL.RawQuery = "x=2" },
		"method":    func(r *http.Request) { r.Method = "GET" },
		"time":      func(r *http.Request) { r.Header.Set(HeaderTime, fmt.Sprint(now.UnixMilli()+1)) },
		"signature": func(r *http.Request) { r.Header.Set(HeaderSignature, strings.Repeat("0", 64)) },
		"twice":     func(r *http.Request) { r.Header.Add(HeaderKeyID, "key_1") },
		"otherSecret": func(r *http.Request) {
			Secret(strings.Repeat("t", 32)).Sign(r, Forward{From: "n1", KeyID: "key_1"}, now)
		},
	} {
		r := signed()
		tamper(r)
		if _, err := secret.Verify(r, now); err == nil {
			t.Errorf("%s changed: accepted", name)
		}
	}
	if _, err := secret.Verify(signed(), now.Add(MaxSkew+time.Second)); err == nil {
		t.Error("a replay after the skew was accepted")
	}
}

func TestLoadSecret(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("too short\n"), 0o600)
	if _, err := LoadSecret(short); err == nil {
		t.Error("a short secret was accepted")
	}
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
	if s, err := LoadSecret(good); err != nil || len(s) != 64 {
		t.Errorf("good secret: %d bytes, %v", len(s), err)
	}
}

// TestForward: the request reaches the other node signed, without the
// caller's key, with its body, and streams back as it is written.
func TestForward(t *testing.T) {
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := secret.Verify(r, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if r.Header.Get("x-api-key") != "" || r.Header.Get("Authorization") != "" || strings.Contains(r.Header.Get("Sec-WebSocket-Protocol"), "sandboxd.key.") {
			http.Error(w, "a key was forwarded", http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s %s %v %s\n\n", f.From, f.KeyID, f.Placed, body)
		w.(http.Flusher).Flush()
		time.Sleep(200 * time.Millisecond)
		fmt.Fprint(w, "data: end\n\n")
	}))
	defer host.Close()
	fw := NewForwarder(secret, "n1", nil, slog.New(slog.DiscardHandler))
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw.Forward(w, r, store.Node{ID: "n2", Address: strings.TrimPrefix(host.URL, "http://")}, "key_1", true)
	}))
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/api/sandboxes/sbx_1/exec", strings.NewReader("hello"))
	req.Header.Set("x-api-key", "secret-user-key")
	req.Header.Set("Sec-WebSocket-Protocol", "sandboxd.key.secret-user-key")
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

	// A node that does not answer: 502 with a JSON error.
	dead := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(dead.URL, "http://")
	dead.Close()
	rec := httptest.NewRecorder()
	fw.Forward(rec, httptest.NewRequest("GET", "/api/sandboxes/sbx_1/ports", nil), store.Node{ID: "n3", Address: addr}, "key_1", false)
	if rec.Code != 502 || !strings.Contains(rec.Body.String(), `"error"`) {
		t.Fatalf("unreachable node: %d %s", rec.Code, rec.Body)
	}
}

// TestDo: a request this node makes itself (for its MCP tools) reaches
// the other node signed for the caller's key id, never with a key, and
// its answer comes back as the other node gave it.
func TestDo(t *testing.T) {
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := secret.Verify(r, time.Now())
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if r.Header.Get("x-api-key") != "" || r.Header.Get("Authorization") != "" {
			http.Error(w, "a key was forwarded", http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusTeapot)
		fmt.Fprintf(w, "%s %s %s %s %v %s", r.Method, r.URL.RequestURI(), f.From, f.KeyID, f.Placed, body)
	}))
	defer host.Close()
	fw := NewForwarder(secret, "n1", nil, slog.New(slog.DiscardHandler))
	node := store.Node{ID: "n2", Address: strings.TrimPrefix(host.URL, "http://")}
	req, _ := http.NewRequest("POST", "/api/sandboxes/sbx_1/exec", strings.NewReader(`{"command":"true"}`))
	req.Header.Set("x-api-key", "secret-user-key")
	req.Header.Set("Authorization", "Bearer secret-user-key")
	resp, err := fw.Do(req, node, "key_1", true)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || string(body) != `POST /api/sandboxes/sbx_1/exec n1 key_1 true {"command":"true"}` {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if req.Header.Get(HeaderSignature) != "" || req.URL.Host != "" {
		t.Error("Do changed the caller's request")
	}

	dead := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(dead.URL, "http://")
	dead.Close()
	req, _ = http.NewRequest("GET", "/api/sandboxes/sbx_1/ports", nil)
	if _, err := fw.Do(req, store.Node{ID: "n3", Address: addr}, "key_1", false); err == nil || !strings.Contains(err.Error(), "n3") {
		t.Fatalf("a node that does not answer: %v", err)
	}
	if _, err := fw.Do(req, store.Node{ID: "n4"}, "key_1", false); err == nil {
		t.Fatal("a node without an address: no error")
	}
}

func TestPlace(t *testing.T) {
	now := time.Now()
	node := func(id string, max int, mod func(*store.Node)) store.Node {
		n := store.Node{ID: id, Address: id + ":7000", Status: store.NodeUp, HeartbeatAt: now,
			Capacity: store.NodeCapacity{MaxSandboxes: max, Runtime: "gvisor", Network: true}}
		if mod != nil {
			mod(&n)
		}
		return n
	}
	nodes := []store.Node{
		node("a", 100, nil), node("b", 100, nil), node("c", 100, nil),
		node("down", 100, func(n *store.Node) { n.Status = store.NodeDown }),
		node("cordoned", 100, func(n *store.Node) { n.Schedule = store.NodeCordoned }),
		node("stale", 100, func(n *store.Node) { n.HeartbeatAt = now.Add(-time.Hour) }),
		node("vm", 100, func(n *store.Node) { n.Capacity.Runtime, n.Capacity.Network = "microvm", false }),
	}
	p := Placer{Choices: 2, Stale: time.Minute, Rand: rand.New(rand.NewPCG(1, 2)), Now: func() time.Time { return now }}
	loads := map[string]int{}
	for range 300 {
		n, err := p.Place(nodes, loads, Need{Runtime: "gvisor", Network: true})
		if err != nil {
			t.Fatal(err)
		}
		loads[n.ID]++
	}
	if loads["a"]+loads["b"]+loads["c"] != 300 || loads["a"] < 90 || loads["b"] < 90 || loads["c"] < 90 {
		t.Fatalf("placement %v: not balanced over the healthy nodes, or placed on an unfit one", loads)
	}
	_, err := p.Place(nodes, loads, Need{Runtime: "gvisor", Fork: true})
	var noRoom *NoRoomError
	if !errors.As(err, &noRoom) {
		t.Fatalf("no node forks: %v", err)
	}
	for _, want := range []string{"7 nodes", "1 down", "1 cordoned", "1 not heartbeating", "1 without the gvisor runtime", "3 unable to fork"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	full := map[string]int{"a": 100, "b": 100, "c": 100}
	if _, err := p.Place(nodes, full, Need{Runtime: "gvisor"}); err == nil || !strings.Contains(err.Error(), "3 full") {
		t.Errorf("all full: %v", err)
	}
}

// TestForwardFullDuplex: a forward's answer streams back while the
// caller's body is still on its way. The caller's server must not take
// the body over when the answer's headers go out (it would read the rest
// to discard it, or close it under the transport's last read of it, which
// cut the answer's stream in about 2% of forwards with a body); here the
// caller sends the end of its body only once it has the first line.
func TestForwardFullDuplex(t *testing.T) {
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := secret.Verify(r, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		_ = http.NewResponseController(w).EnableFullDuplex()
		head := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, head); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "got %s\n", head)
		w.(http.Flusher).Flush()
		rest, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "then %s\n", rest)
	}))
	defer host.Close()
	fw := NewForwarder(secret, "n1", nil, slog.New(slog.DiscardHandler))
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw.Forward(w, r, store.Node{ID: "n2", Address: strings.TrimPrefix(host.URL, "http://")}, "key_1", false)
	}))
	defer front.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, more := io.Pipe()
	// On a failure, the body ends with the time allowed: the client's
	// transport waits for its body before it returns the error, and the
	// servers for their handlers, which read it.
	context.AfterFunc(ctx, func() { more.CloseWithError(ctx.Err()) })
	go func() { _, _ = more.Write([]byte("hello")) }()
	req, _ := http.NewRequestWithContext(ctx, "POST", front.URL+"/api/sandboxes/sbx_1/exec", body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the answer did not start before the body ended: %v", err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); line != "got hello\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	_, _ = more.Write([]byte(" world"))
	more.Close()
	if line, err := br.ReadString('\n'); line != "then  world\n" {
		t.Fatalf("second line %q, %v", line, err)
	}
}
