package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func TestLoadAdminKey(t *testing.T) {
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(short, []byte("tooshort\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte(strings.Repeat("k", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadAdminKey(short); err == nil || !strings.Contains(err.Error(), "want at least 32") {
		t.Errorf("short key: %v", err)
	}
	if _, err := loadAdminKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file: no error")
	}
	if k, err := loadAdminKey(good); err != nil || string(k) != strings.Repeat("k", 40) {
		t.Errorf("good key: %q %v", k, err)
	}
}

// TestAdminOnly: River's UI opens only with the operator's key; a request
// that changes something from another site is refused even with it (the
// browser would send the Basic credentials along); the cluster listener
// never serves it.
func TestAdminOnly(t *testing.T) {
	securitytest.Attack(t, "console", "an account key, a wrong key, no key, a cross-site POST carrying the operator's cached Basic credentials, or a request on the cluster listener reaches River's UI (/riverui), which shows every account's jobs",
		"401 without the operator's key (account keys included), 403 for a cross-site request that changes something, 404 on the cluster listener; only the operator's key reaches it")
	key := []byte(strings.Repeat("a", 32))
	reached := 0
	h := adminOnly(key, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ }))
	cases := []struct {
		name    string
		method  string
		pass    string
		headers map[string]string
		cluster bool
		want    int
	}{
		{"no key", "GET", "", nil, false, 401},
		{"wrong key", "GET", "sbx_accountkey", nil, false, 401},
		{"operator", "GET", string(key), nil, false, 200},
		{"operator, same-origin POST", "POST", string(key), map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://example.test"}, false, 200},
		{"operator, cross-site POST", "POST", string(key), map[string]string{"Sec-Fetch-Site": "cross-site"}, false, 403},
		{"operator, other origin", "DELETE", string(key), map[string]string{"Origin": "http://evil.test"}, false, 403},
		{"cluster listener", "GET", string(key), nil, true, 404},
	}
	for _, tc := range cases {
		req := httptest.NewRequest(tc.method, "http://example.test/riverui/api/jobs", nil)
		if tc.pass != "" {
			req.SetBasicAuth("anyone", tc.pass)
		}
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		var handler http.Handler = h
		if tc.cluster {
			handler = edge.ClusterHandler(acceptAll{}, h, nil, func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusUnauthorized) })
		}
		before := reached
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, rec.Code, tc.want)
		}
		if (reached > before) != (tc.want == 200) {
			t.Errorf("%s: reached the UI: %v", tc.name, reached > before)
		}
		if tc.want == 401 && !strings.HasPrefix(rec.Header().Get("WWW-Authenticate"), "Basic ") {
			t.Errorf("%s: no Basic challenge", tc.name)
		}
	}
}

// TestRiverUIOff: without --admin-key-file nothing is mounted.
func TestRiverUIOff(t *testing.T) {
	m, err := riverUIMounts(context.Background(), nil, nil, nil)
	if err != nil || m != nil {
		t.Fatalf("%v %v", m, err)
	}
}

// acceptAll is a cluster whose every request is signed (another node's
// forward), for what the handlers behind the listener do with one.
type acceptAll struct{ edge.Cluster }

func (acceptAll) Forwarded(*http.Request) (string, bool, error) { return "k", false, nil }
