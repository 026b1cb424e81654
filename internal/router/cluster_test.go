package router_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/router"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// headerCluster stands in for the cluster's router: a request is another
// node's forward exactly when it carries the header "Signed: yes" (the
// real signature is package cluster's, tested there).
type headerCluster struct{}

func (headerCluster) Forwarded(r *http.Request) (string, bool, error) {
	if r.Header.Get("Signed") != "yes" {
		return "", false, errUnsigned
	}
	return "key-id", false, nil
}
func (headerCluster) HostOf(context.Context, string) (string, bool) { return "", false }
func (headerCluster) Place(context.Context, *netpol.Policy) (string, bool, error) {
	return "", true, nil
}
func (headerCluster) Forward(w http.ResponseWriter, _ *http.Request, _, _ string, _ bool) {
	w.WriteHeader(http.StatusTeapot)
}
func (headerCluster) Do(*http.Request, string, string, bool) (*http.Response, error) {
	return nil, errUnsigned
}

var errUnsigned = auth.ErrUnauthorized

// TestClusterListenerRefusesUnsigned: whatever is mounted beside the API
// (the git server, MCP, the console, the model proxy authenticate plain
// keys) is reached on the cluster listener only by signed forwards.
func TestClusterListenerRefusesUnsigned(t *testing.T) {
	securitytest.Attack(t, "cluster", "a plain account key (or none) is sent to a node's cluster listener for /git, /mcp, /console and /model, which authenticate keys themselves",
		"401 at the listener for every unsigned request, whatever its path; only other nodes' signed forwards reach the handlers")
	st := storetest.Open(t, filepath.Join(t.TempDir(), "api.db"))
	reached := map[string]int{}
	mount := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reached[name]++ })
	}
	a := auth.NewAuthenticator(st)
	gate, err := edge.NewGate(a, headerCluster{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{Store: st, Auth: a, Gate: gate, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	rt := router.New(router.Options{Routes: append(srv.Routes(), router.Mounts(map[string]http.Handler{
		"/git/*": mount("git"), "/mcp": mount("mcp"), "/console/*": mount("console"), "/model/*": mount("model")})...),
		NotFound: http.HandlerFunc(srv.NotFound)})
	listener := rt.ClusterHandler(headerCluster{}, srv.Refuse)
	for _, path := range []string{"/git/acct.git/info/refs?service=git-upload-pack", "/mcp", "/console/", "/model/openai/chat/completions", "/api/sandboxes", "/api/health"} {
		for _, signed := range []bool{false, true} {
			req := httptest.NewRequest(http.MethodGet, path, nil)
			req.Header.Set("x-api-key", "sbx_plainaccountkey")
			if signed {
				req.Header.Set("Signed", "yes")
			}
			before := total(reached)
			rec := httptest.NewRecorder()
			listener.ServeHTTP(rec, req)
			if !signed && (rec.Code != http.StatusUnauthorized || total(reached) != before) {
				t.Errorf("unsigned %s on the cluster listener: %d (reached a handler: %v), want 401 and nothing reached", path, rec.Code, total(reached) != before)
			}
			if signed && rec.Code == http.StatusUnauthorized && path != "/api/sandboxes" {
				t.Errorf("signed %s on the cluster listener: 401, want it served", path)
			}
		}
	}
	for _, name := range []string{"git", "mcp", "console", "model"} {
		if reached[name] != 1 {
			t.Errorf("%s reached %d times, want once (the signed request)", name, reached[name])
		}
	}
	// No cluster at all: nothing is served there.
	lone, err := api.New(api.Options{Store: st, Auth: auth.NewAuthenticator(st), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	loneRouter := router.New(router.Options{Routes: lone.Routes()})
	req := httptest.NewRequest(http.MethodGet, "/api/health", nil)
	req.Header.Set("Signed", "yes")
	rec := httptest.NewRecorder()
	loneRouter.ClusterHandler(nil, lone.Refuse).ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("a cluster listener without a cluster: %d, want 401", rec.Code)
	}
}

func total(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}
