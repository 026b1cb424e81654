package homegate

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestOnly(t *testing.T) {
	h := Only(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }), "/api/", "/git/", "/mcp", "/model/")
	for path, want := range map[string]int{
		"/api/sandboxes":                   http.StatusTeapot,
		"/git/acct.git/info/refs":          http.StatusTeapot,
		"/mcp":                             http.StatusTeapot,
		"/model/openai/chat/completions":   http.StatusTeapot,
		"/mcpx":                            http.StatusNotFound,
		"/api":                             http.StatusNotFound,
		"/sandboxes":                       http.StatusNotFound, // E2B's control plane
		"/process.Process/Start":           http.StatusNotFound, // envd's
		"/files":                           http.StatusNotFound,
		"/console/":                        http.StatusNotFound,
		"/index.html":                      http.StatusNotFound, // a port host's page
		"/api/../sandboxes":                http.StatusNotFound,
		"/api/x/%2E%2E/%2E%2E/sandboxes":   http.StatusNotFound,
		"/api//sandboxes":                  http.StatusNotFound,
		"/model/openai/./../../index.html": http.StatusNotFound,
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "http://sandboxd.internal"+path, nil)
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("%s: %d, want %d", path, rec.Code, want)
		}
	}
}
