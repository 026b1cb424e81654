package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestContract checks authentication, access rules and validation against
// a real server, on SQLite and on PostgreSQL.
func TestContract(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, dsn string) {
		s := startServer(t, dsn)
		alice := s.createAccount("Alice", false)
		bob := s.createAccount("Bob", false)
		carol := s.createAccount("Carol", false)
		org := s.createAccount("Acme Records", true)
		s.admin(nil, "admin", "org", "add-member", "--org", org.ID, "--account", alice.ID)
		aliceKey := s.createKey(alice.ID)
		orgKey := s.createKey(org.ID)
		revoked := s.createKey(bob.ID)
		s.admin(nil, "admin", "key", "revoke", revoked.ID)

		t.Run("authentication", func(t *testing.T) {
			exactlyOne := map[string]any{"status": "error", "error": "Exactly one of x-api-key or Authorization must be provided"}
			unauthorized := map[string]any{"status": "error", "error": "Unauthorized", "message": "Unauthorized"}
			cases := []struct {
				name    string
				headers map[string]string
				status  int
				body    map[string]any
			}{
				{"no key", nil, 401, exactlyOne},
				{"both headers", map[string]string{"x-api-key": aliceKey.Key, "Authorization": "Bearer " + aliceKey.Key}, 401, exactlyOne},
				{"unknown key", map[string]string{"x-api-key": "sbx_notakey"}, 401, unauthorized},
				{"revoked key", map[string]string{"x-api-key": revoked.Key}, 401, unauthorized},
				{"bearer without token", map[string]string{"Authorization": "Bearer "}, 401, nil},
				{"x-api-key", map[string]string{"x-api-key": aliceKey.Key}, 200, nil},
				{"bearer", map[string]string{"Authorization": "Bearer " + aliceKey.Key}, 200, nil},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					r := s.call(http.MethodGet, "/api/sandboxes", tc.headers, nil)
					if r.Status != tc.status {
						t.Fatalf("status %d, want %d: %s", r.Status, tc.status, r.Raw)
					}
					if tc.body != nil && !reflect.DeepEqual(r.Body, tc.body) {
						t.Fatalf("body %v, want %v", r.Body, tc.body)
					}
				})
			}
		})

		t.Run("repeated credentials", func(t *testing.T) {
			securitytest.Attack(t, "api", "a client sends x-api-key twice (a valid key, then another) and Authorization twice to a real server",
				"401 with the contract's \"Exactly one of x-api-key or Authorization must be provided\"; no value is picked")
			for _, h := range [][2]string{{"x-api-key", aliceKey.Key}, {"Authorization", "Bearer " + aliceKey.Key}} {
				req, _ := http.NewRequest(http.MethodGet, s.base+"/api/sandboxes", nil)
				req.Header.Add(h[0], h[1])
				req.Header.Add(h[0], h[1]+"x")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 401 || !strings.Contains(string(body), "Exactly one of x-api-key or Authorization must be provided") {
					t.Fatalf("%s twice: %d %s", h[0], resp.StatusCode, body)
				}
			}
		})

		t.Run("validation", func(t *testing.T) {
			cases := []struct {
				name, method, path string
				body               any
				msg                string
				fields             []any
			}{
				{"malformed JSON", "POST", "/api/sandboxes", `{"command":`, "Request body must be valid JSON", nil},
				{"malformed JSON on PATCH", "PATCH", "/api/sandboxes", `{nope`, "Request body must be valid JSON", nil},
				{"malformed JSON on files", "POST", "/api/sandboxes/files", `[`, "Request body must be valid JSON", nil},
				{"command and prompt", "POST", "/api/sandboxes", map[string]any{"command": "ls", "prompt": "hi"}, "Cannot specify both command and prompt", []any{"prompt"}},
				{"empty command", "POST", "/api/sandboxes", map[string]any{"command": ""}, "command cannot be empty", []any{"command"}},
				{"empty prompt", "POST", "/api/sandboxes", map[string]any{"prompt": ""}, "prompt cannot be empty", []any{"prompt"}},
				{"non-UUID account_id", "POST", "/api/sandboxes", map[string]any{"account_id": "nope"}, "account_id must be a valid UUID", []any{"account_id"}},
				{"empty snapshotId", "PATCH", "/api/sandboxes", map[string]any{"snapshotId": ""}, "snapshotId cannot be empty", []any{"snapshotId"}},
				{"bad github_repo", "PATCH", "/api/sandboxes", map[string]any{"github_repo": "not a url"}, "github_repo must be a valid URL", []any{"github_repo"}},
				{"empty files", "POST", "/api/sandboxes/files", map[string]any{"files": []any{}}, "At least one file is required", []any{"files"}},
				{"file:// URL", "POST", "/api/sandboxes/files", map[string]any{"files": []any{map[string]any{"url": "file:///etc/passwd", "name": "x"}}}, "Each file must have a valid URL", []any{"files", 0.0, "url"}},
				{"file without name", "POST", "/api/sandboxes/files", map[string]any{"files": []any{map[string]any{"url": "https://example.test/a"}}}, "Each file must have a name", []any{"files", 0.0, "name"}},
				{"missing path", "GET", "/api/sandboxes/file", nil, "path is required", nil},
				{"empty path", "GET", "/api/sandboxes/file?path=", nil, "path cannot be empty", nil},
				{"empty runId", "GET", "/api/tasks/runs?runId=", nil, "runId is required", nil},
				{"query account_id", "GET", "/api/sandboxes?account_id=xyz", nil, "account_id must be a valid UUID", nil},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					r := s.as(aliceKey, tc.method, tc.path, tc.body)
					if r.Status != http.StatusBadRequest {
						t.Fatalf("status %d, want 400: %s", r.Status, r.Raw)
					}
					want := map[string]any{"status": "error", "error": tc.msg}
					if tc.fields != nil {
						want["missing_fields"] = tc.fields
					}
					if !reflect.DeepEqual(r.Body, want) {
						t.Fatalf("body %s, want %v", r.Raw, want)
					}
				})
			}
		})

		t.Run("access", func(t *testing.T) {
			forbidden := map[string]any{"status": "error", "error": "Access denied to specified account_id"}
			cases := []struct {
				name   string
				k      key
				target string
				status int
			}{
				{"personal key, own account", aliceKey, alice.ID, 200},
				{"personal key, another account", aliceKey, bob.ID, 403},
				{"org key, member", orgKey, alice.ID, 200},
				{"org key, non-member", orgKey, carol.ID, 403},
				{"org key, itself", orgKey, org.ID, 200},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					r := s.as(tc.k, "GET", "/api/sandboxes?account_id="+tc.target, nil)
					if r.Status != tc.status {
						t.Fatalf("status %d, want %d: %s", r.Status, tc.status, r.Raw)
					}
					if tc.status == 403 && !reflect.DeepEqual(r.Body, forbidden) {
						t.Fatalf("body %s", r.Raw)
					}
					// The same rule holds for bodies.
					r = s.as(tc.k, "PATCH", "/api/sandboxes", map[string]any{"account_id": tc.target})
					if r.Status != tc.status {
						t.Fatalf("PATCH status %d, want %d: %s", r.Status, tc.status, r.Raw)
					}
				})
			}
		})

		t.Run("empty account lists nothing", func(t *testing.T) {
			r := s.as(aliceKey, "GET", "/api/sandboxes", nil)
			want := map[string]any{"status": "success", "sandboxes": []any{}, "snapshot_id": nil, "github_repo": nil, "filetree": nil}
			if r.Status != 200 || !reflect.DeepEqual(r.Body, want) {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
		})

		t.Run("not the caller's", func(t *testing.T) {
			r := s.as(aliceKey, "GET", "/api/tasks/runs?runId=run_doesnotexist", nil)
			if r.Status != 404 || r.Body["error"] != "Task run not found" {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
			r = s.as(aliceKey, "PATCH", "/api/sandboxes", map[string]any{"snapshotId": "snap_unknown"})
			if r.Status != 404 {
				t.Fatalf("PATCH unknown snapshot: %d %s", r.Status, r.Raw)
			}
			r = s.as(aliceKey, "POST", "/api/sandboxes/sbx_unknown/stop", nil)
			if r.Status != 404 {
				t.Fatalf("stop unknown sandbox: %d %s", r.Status, r.Raw)
			}
		})

		t.Run("CORS and OPTIONS", func(t *testing.T) {
			for _, path := range []string{"/api/sandboxes", "/api/tasks/runs", "/api/sandboxes/files", "/api/sandboxes/x/exec"} {
				r := s.call(http.MethodOptions, path, nil, nil)
				if r.Status != 200 || len(r.Raw) != 0 {
					t.Fatalf("OPTIONS %s: %d %q", path, r.Status, r.Raw)
				}
				if r.Header.Get("Access-Control-Allow-Origin") != "*" ||
					r.Header.Get("Access-Control-Allow-Methods") != "GET, POST, PUT, DELETE, OPTIONS, PATCH" ||
					r.Header.Get("Access-Control-Allow-Headers") != "Content-Type, Authorization, X-Requested-With, x-api-key" {
					t.Fatalf("OPTIONS %s headers: %v", path, r.Header)
				}
			}
			r := s.call(http.MethodGet, "/api/sandboxes", nil, nil)
			if r.Header.Get("Access-Control-Allow-Origin") != "*" {
				t.Fatalf("401 without CORS headers: %v", r.Header)
			}
		})

		t.Run("openapi", func(t *testing.T) {
			r := s.call(http.MethodGet, "/api/openapi.json", nil, nil)
			if r.Status != 200 {
				t.Fatalf("%d", r.Status)
			}
			var doc struct {
				OpenAPI string                            `json:"openapi"`
				Paths   map[string]map[string]interface{} `json:"paths"`
			}
			if err := json.Unmarshal(r.Raw, &doc); err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(doc.OpenAPI, "3.1") {
				t.Fatalf("openapi %q", doc.OpenAPI)
			}
			want := map[string][]string{
				"/api/sandboxes":              {"get", "post", "patch", "delete"},
				"/api/sandboxes/files":        {"post"},
				"/api/sandboxes/file":         {"get"},
				"/api/tasks/runs":             {"get"},
				"/api/sandboxes/{id}/exec":    {"post"},
				"/api/sandboxes/{id}/stop":    {"post"},
				"/api/sandboxes/{id}/timeout": {"post"},
				"/api/tasks/coding-agent":     {"post"},
				"/api/health":                 {"get"},
			}
			for path, methods := range want {
				for _, m := range methods {
					if _, ok := doc.Paths[path][m]; !ok {
						t.Errorf("openapi lacks %s %s", strings.ToUpper(m), path)
					}
				}
			}
		})

		t.Run("health and metrics", func(t *testing.T) {
			r := s.call(http.MethodGet, "/api/health", nil, nil)
			if r.Status != 200 || r.Body["status"] != "success" {
				t.Fatalf("%d %s", r.Status, r.Raw)
			}
			// The runtime names its platform and runsc (gVisor, the default).
			if rt, _ := r.Body["runtime"].(string); !strings.HasPrefix(rt, "gvisor ") || !strings.Contains(rt, "runsc ") {
				t.Errorf("health's runtime %q", rt)
			}
			securitytest.Attack(t, "api", "an unauthenticated client reads /metrics on the API port to learn every route and its counts",
				"the API port answers 404; the metrics are served only on --metrics-addr (loopback by default)")
			r = s.call(http.MethodGet, "/metrics", nil, nil)
			if r.Status != http.StatusNotFound || strings.Contains(string(r.Raw), "sandboxd_http_requests_total") {
				t.Fatalf("metrics on the API port: %d %s", r.Status, r.Raw)
			}
			resp, err := http.Get(s.metrics + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(body), "sandboxd_http_requests_total") {
				t.Fatalf("metrics listener: %d", resp.StatusCode)
			}
		})
	})
}
