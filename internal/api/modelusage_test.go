package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestModelUsage: GET /api/model/usage answers the account's day of the
// model proxy (the real proxy's count on the fixture's store) with its
// budgets and their reset; a sandbox's own key reads its account's; no key
// reads another account's.
func TestModelUsage(t *testing.T) {
	securitytest.Attack(t, "api",
		"a sandbox's key (and an account key) asks GET /api/model/usage for another account's model usage (account_id)",
		"403 for another account; each key reads its own account's day, never another's")
	f := newFixture(t)
	ctx := context.Background()
	now := time.Date(2025, 3, 14, 18, 0, 0, 0, time.UTC)
	proxy, err := modelproxy.New(modelproxy.Options{
		Auth: auth.NewAuthenticator(f.st), Usage: f.st, Now: func() time.Time { return now },
		Budgets: modelproxy.Budgets{TokensPerDay: 50_000_000},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Store: f.st, Auth: auth.NewAuthenticator(f.st), Version: "test", ModelUsage: proxy})
	if err != nil {
		t.Fatal(err)
	}
	other := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &other); err != nil {
		t.Fatal(err)
	}
	for _, add := range []store.ModelUsage{
		{AccountID: f.account.ID, Day: now, Requests: 3, InputTokens: 1200, OutputTokens: 34},
		{AccountID: f.account.ID, Day: now.Add(-24 * time.Hour), Requests: 99, InputTokens: 99},
		{AccountID: other.ID, Day: now, Requests: 7, InputTokens: 7},
	} {
		if _, err := f.st.AddModelUsage(ctx, add); err != nil {
			t.Fatal(err)
		}
	}
	sandboxKey := mintSandboxKey(t, f.st, f.account.ID)
	get := func(key, target string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", target, nil)
		req.Header.Set("x-api-key", key)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		return rec
	}
	for _, key := range []string{f.key, sandboxKey} {
		rec := get(key, "/api/model/usage")
		var got ModelUsageResponse
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		if got.Status != "success" || got.Day != "2025-03-14" || got.Requests != 3 || got.Tokens != 1234 || got.InputTokens != 1200 || got.OutputTokens != 34 ||
			got.RequestsBudget != nil || got.TokensBudget == nil || *got.TokensBudget != 50_000_000 || got.ResetsAt != "2025-03-15T00:00:00.000Z" {
			t.Fatalf("usage %s", rec.Body)
		}
		if rec := get(key, "/api/model/usage?account_id="+f.account.ID); rec.Code != http.StatusOK {
			t.Fatalf("own account_id: %d %s", rec.Code, rec.Body)
		}
		if rec := get(key, "/api/model/usage?account_id="+other.ID); rec.Code != http.StatusForbidden {
			t.Fatalf("another account's usage: %d %s", rec.Code, rec.Body)
		}
		if rec := get(key, "/api/model/usage?account_id=nope"); rec.Code != http.StatusBadRequest {
			t.Fatalf("a bad account_id: %d %s", rec.Code, rec.Body)
		}
	}
	if rec := get("sbx_nope", "/api/model/usage"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("unknown key: %d %s", rec.Code, rec.Body)
	}
	// A server without the model proxy says so.
	if rec := f.do("GET", "/api/model/usage", ""); rec.Code != http.StatusNotImplemented {
		t.Fatalf("without the service: %d %s", rec.Code, rec.Body)
	}
}

// mintSandboxKey makes a running sandbox of account and returns its key.
func mintSandboxKey(t *testing.T, st *store.Store, account string) string {
	t.Helper()
	ctx := context.Background()
	sb := store.Sandbox{AccountID: account, NodeID: "n", Status: store.SandboxRunning, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
	if err := st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	plaintext, prefix, hash, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateAPIKey(ctx, &store.APIKey{AccountID: account, Prefix: prefix, Hash: hash, SandboxID: sb.ID}); err != nil {
		t.Fatal(err)
	}
	return plaintext
}
