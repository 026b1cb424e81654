package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func TestMillisecondFieldsCannotOverflow(t *testing.T) {
	securitytest.Attack(t, "api", "a timeout above 9.2e12 ms (and 1e19, 1e300) on create, exec and the timeout route, to wrap into a negative lifetime that passes the maximum check",
		"every millisecond field is range-checked before it becomes a time.Duration: 400 with a message naming the field and its bound")
	f := newFixture(t)
	routes := []struct{ method, path, extra string }{
		{"POST", "/api/sandboxes", ``},
		{"POST", "/api/sandboxes/sbx_x/exec", `"command":"ls",`},
		{"POST", "/api/sandboxes/sbx_x/timeout", ``},
	}
	cases := []struct {
		value string
		code  int
		msg   string
	}{
		{"9223372036855", 400, "timeout must be at most 9223372036854 milliseconds"},
		{"9223372036854775807", 400, "timeout is out of range"},
		{"1e19", 400, "timeout is out of range"},
		{"-1e19", 400, "timeout is out of range"},
		{"1e300", 400, "timeout is out of range"},
		{"-5", 400, "timeout must be a positive number of milliseconds"},
		{"9223372036854", 0, ""}, // the largest that fits passes validation
	}
	for _, rt := range routes {
		for _, tc := range cases {
			t.Run(rt.path+"/"+tc.value, func(t *testing.T) {
				rec := f.do(rt.method, rt.path, "{"+rt.extra+`"timeout":`+tc.value+"}")
				if tc.code == 0 {
					if rec.Code == http.StatusBadRequest {
						t.Fatalf("valid timeout refused: %s", rec.Body)
					}
					return
				}
				var body map[string]any
				_ = json.Unmarshal(rec.Body.Bytes(), &body)
				if rec.Code != tc.code || body["error"] != tc.msg {
					t.Fatalf("%d %s, want %d %q", rec.Code, rec.Body, tc.code, tc.msg)
				}
			})
		}
	}
}

func TestRepeatedCredentialHeadersAreRefused(t *testing.T) {
	securitytest.Attack(t, "api", "x-api-key or Authorization sent twice (same value, a valid then an invalid key, an invalid then a valid one)",
		"401 \"Exactly one of x-api-key or Authorization must be provided\", as for two different headers; one valid header still works")
	f := newFixture(t)
	cases := []struct {
		name   string
		header string
		values []string
		code   int
	}{
		{"x-api-key same twice", "x-api-key", []string{f.key, f.key}, 401},
		{"x-api-key valid then invalid", "x-api-key", []string{f.key, "sbx_nope"}, 401},
		{"x-api-key invalid then valid", "x-api-key", []string{"sbx_nope", f.key}, 401},
		{"Authorization twice", "Authorization", []string{"Bearer " + f.key, "Bearer sbx_nope"}, 401},
		{"x-api-key once", "x-api-key", []string{f.key}, 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", "/api/tasks/runs", nil)
			for _, v := range tc.values {
				req.Header.Add(tc.header, v)
			}
			rec := httptest.NewRecorder()
			f.srv.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Fatalf("%d %s, want %d", rec.Code, rec.Body, tc.code)
			}
			if tc.code == 401 && !strings.Contains(rec.Body.String(), "Exactly one of x-api-key or Authorization must be provided") {
				t.Fatalf("body %s", rec.Body)
			}
		})
	}
}
