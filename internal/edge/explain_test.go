package edge

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestExplain is the one test of the one error table: every front end
// answers through Explain, so what a class is told is decided here.
func TestExplain(t *testing.T) {
	secret := errors.New("nft: table inet sandboxd_x: /var/lib/secret")
	cases := []struct {
		name     string
		err      error
		notFound string
		status   int
		msg      string
		echo     bool
		internal bool
	}{
		{"front end's own error", &Error{Status: 418, Msg: "teapot", Fields: []any{"x"}}, "", 418, "teapot", false, false},
		{"wrapped front end's error", fmt.Errorf("ctx: %w", Errorf(400, "bad %s", "x")), "", 400, "bad x", false, false},
		{"no credentials", auth.ErrCredentials, "", 401, "Exactly one of x-api-key or Authorization must be provided", false, false},
		{"bad key", fmt.Errorf("authenticate: %w", auth.ErrUnauthorized), "", 401, "Unauthorized", true, false},
		{"bad account_id", auth.ErrInvalidAccountID, "", 400, "account_id must be a valid UUID", false, false},
		{"foreign account_id", auth.ErrForbidden, "", 403, "Access denied to specified account_id", false, false},
		{"sandbox key's write", auth.ErrScope, "", 403, "This key belongs to a sandbox and may only read (GET) the API, use the git server and the model proxy", false, false},
		{"not found with its message", errdefs.New(errdefs.ErrNotFound, "Sandbox not found"), "Run not found", 404, "Sandbox not found", false, false},
		{"bare not found", errdefs.ErrNotFound, "Run not found", 404, "Run not found", false, false},
		{"store's not found", fmt.Errorf("get: %w", store.ErrNotFound), "Sandbox not found", 404, "Sandbox not found", false, false},
		{"store's not found, no message", store.ErrNotFound, "", 404, "Not found", false, false},
		{"no repository", errdefs.ErrNoRepository, "Sandbox not found", 404, "No GitHub repository found for this account", false, false},
		{"quota", errdefs.Newf(errdefs.ErrQuota, "account has %d active sandboxes", 3), "", 429, "account has 3 active sandboxes", false, false},
		{"invalid, cause hidden", errdefs.Wrap(errdefs.ErrInvalid, secret, "bad policy"), "", 400, "bad policy", false, false},
		{"invalid with context", fmt.Errorf("network: %w", errdefs.Wrap(errdefs.ErrInvalid, secret, "bad policy")), "", 400, "network: bad policy", false, false},
		{"too large", errdefs.New(errdefs.ErrTooLarge, "archive over 1 GiB"), "", 413, "archive over 1 GiB", false, false},
		{"body too large", fmt.Errorf("read: %w", &http.MaxBytesError{Limit: 1024}), "", 413, "Request body is larger than 1024 bytes", false, false},
		{"forbidden", errdefs.ErrForbidden, "", 403, "Forbidden", false, false},
		{"not running", errdefs.ErrNotRunning, "", 409, "Sandbox is not running", false, false},
		{"not running, says why", errdefs.New(errdefs.ErrNotRunning, "a run is executing"), "", 409, "a run is executing", false, false},
		{"conflict", errdefs.New(errdefs.ErrConflict, "template base:v1 is in use"), "", 409, "template base:v1 is in use", false, false},
		{"bare conflict", errdefs.ErrConflict, "", 409, "Conflict", false, false},
		{"anything else", fmt.Errorf("query: %w", secret), "", 500, InternalMessage, false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, internal := Explain(tc.err, tc.notFound)
			if e.Status != tc.status || e.Msg != tc.msg || e.Echo != tc.echo || internal != tc.internal {
				t.Fatalf("Explain = %d %q echo=%v internal=%v; want %d %q echo=%v internal=%v", e.Status, e.Msg, e.Echo, internal, tc.status, tc.msg, tc.echo, tc.internal)
			}
			if strings.Contains(e.Msg, "secret") || strings.Contains(e.Msg, "nft") {
				t.Fatalf("the cause reached the caller: %q", e.Msg)
			}
		})
	}
}

func TestScopeError(t *testing.T) {
	e, _ := Explain(fmt.Errorf("route: %w", ScopeError("POST /api/sandboxes")), "")
	if e.Status != http.StatusForbidden || !strings.HasSuffix(e.Msg, "; POST /api/sandboxes needs an account key") {
		t.Fatalf("ScopeError answered %d %q", e.Status, e.Msg)
	}
}

// TestExplainAccountIDField: a bad account_id names its field, as every
// other failing field of a body does (the REST contract's missing_fields).
func TestExplainAccountIDField(t *testing.T) {
	e, _ := Explain(fmt.Errorf("resolve: %w", auth.ErrInvalidAccountID), "")
	if fmt.Sprint(e.Fields) != "[account_id]" {
		t.Fatalf("Fields = %v, want [account_id]", e.Fields)
	}
}
