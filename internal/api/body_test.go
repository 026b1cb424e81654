package api

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/sandbox"
)

// TestBodyDeadlineEndsWithTheBody: the read deadlines are the body's
// only. A request whose body arrived whole and whose handler then works
// for longer than the idle deadline is not cut off: the connection's
// background read, which watches for a client that goes away, has no
// deadline, so the request's context lives on.
func TestBodyDeadlineEndsWithTheBody(t *testing.T) {
	w := newWSFixture(t, func(ctx context.Context, _ sandbox.ExecRequest, stdout, _ io.Writer) (sandbox.ExecResult, error) {
		select {
		case <-ctx.Done():
			return sandbox.ExecResult{}, ctx.Err()
		case <-time.After(20 * 50 * time.Millisecond): // many idle deadlines
		}
		_, _ = io.WriteString(stdout, "still here")
		return sandbox.ExecResult{}, nil
	})
	srv, err := New(Options{Store: w.st, Auth: auth.NewAuthenticator(w.st), Version: "test", Sandboxes: w.srv.opts.Sandboxes, BodyIdleTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	req, _ := http.NewRequest("POST", ts.URL+"/api/sandboxes/"+w.sandbox+"/exec", strings.NewReader(`{"command":"sleep"}`))
	req.Header.Set("x-api-key", w.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"stdout":"still here"`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}
