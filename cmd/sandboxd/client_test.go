package main

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	client "github.com/sandboxd/sandboxd/clients/go"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func TestClientKeyDoesNotFollowRedirectsToOtherHosts(t *testing.T) {
	securitytest.Attack(t, "cli", "the API answers the CLI with a redirect to another host, to collect the x-api-key the CLI sends",
		"the CLI drops x-api-key (and Authorization) when a redirect leaves the origin; redirects within it keep the key")
	var (
		mu   sync.Mutex
		seen = map[string]string{} // server -> x-api-key received
	)
	record := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			seen[name] = r.Header.Get("x-api-key")
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"status":"success"}`))
		}
	}
	evil := httptest.NewServer(record("evil"))
	defer evil.Close()
	// The client calls GET /api/sandboxes under a base path of the
	// server's: /away answers with a redirect to another host, /here
	// with one to a path of its own.
	mux := http.NewServeMux()
	mux.HandleFunc("/away/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, evil.URL+"/steal", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("/here/", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/same", http.StatusFound)
	})
	mux.HandleFunc("/same", record("api"))
	api := httptest.NewServer(mux)
	defer api.Close()

	cases := []struct {
		base, server, wantKey string
	}{
		{"/away", "evil", ""},
		{"/here", "api", "sbx_secret"},
	}
	for _, tc := range cases {
		t.Run(tc.base, func(t *testing.T) {
			c := &apiClient{url: api.URL + tc.base, key: "sbx_secret", http: newAPIHTTPClient()}
			cl, err := c.api()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.Check(cl.GetSandboxesWithResponse(t.Context(), nil)); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			got, ok := seen[tc.server]
			mu.Unlock()
			if !ok {
				t.Fatalf("the redirect did not reach %s", tc.server)
			}
			if got != tc.wantKey {
				t.Fatalf("%s received x-api-key %q, want %q", tc.server, got, tc.wantKey)
			}
		})
	}
}
