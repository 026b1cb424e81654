package cluster

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

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
