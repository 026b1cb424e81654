package api_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// TestWebhookRoutes: the account registers, reads, changes and deletes its
// webhooks (the secret answered once); another account sees none of them;
// a sandbox's own key reads the account's events but never its webhooks,
// whose URLs may carry their receivers' tokens; bad input is 400.
func TestWebhookRoutes(t *testing.T) {
	securitytest.Attack(t, "webhooks", "code in a sandbox reads the account's webhooks (their URLs may carry the receivers' tokens) with the sandbox's own key",
		"403: the webhook routes count as acting, which a sandbox's key may not; it reads the events only")
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	keys := accountKeys(t, st, "alice", "bob")
	events, err := webhooks.New(webhooks.Config{Store: st, Key: bytes.Repeat([]byte{3}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Options{Store: st, Auth: auth.NewAuthenticator(st), Version: "test", Events: events})
	if err != nil {
		t.Fatal(err)
	}
	call := jsonCaller(t, h, keys)
	// A key minted for one of alice's sandboxes, as the manager mints it.
	accounts, _ := st.ListAccounts(t.Context())
	for _, a := range accounts {
		if a.Name != "alice" {
			continue
		}
		sb := store.Sandbox{AccountID: a.ID, NodeID: "n", Status: store.SandboxRunning, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
		if err := st.CreateSandbox(t.Context(), &sb); err != nil {
			t.Fatal(err)
		}
		plaintext, prefix, hash, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CreateAPIKey(t.Context(), &store.APIKey{AccountID: a.ID, Prefix: prefix, Hash: hash, SandboxID: sb.ID}); err != nil {
			t.Fatal(err)
		}
		keys["alice's sandbox"] = plaintext
	}

	code, out := call("alice", "POST", "/api/webhooks", `{"url":"https://hooks.example/in?token=receiver-secret","events":["sandbox.failed"]}`)
	if code != 200 || !strings.HasPrefix(out["secret"].(string), "whsec_") {
		t.Fatalf("register: %d %v", code, out)
	}
	id := out["webhook"].(map[string]any)["id"].(string)
	if code, out := call("alice", "GET", "/api/webhooks", ""); code != 200 || len(out["webhooks"].([]any)) != 1 || out["secret"] != nil {
		t.Fatalf("list: %d %v", code, out)
	}
	for _, path := range []string{"/api/webhooks", "/api/webhooks/" + id, "/api/webhooks/" + id + "/deliveries"} {
		if code, out := call("alice's sandbox", "GET", path, ""); code != http.StatusForbidden {
			t.Fatalf("a sandbox's key reads %s: %d %v", path, code, out)
		}
	}
	if code, _ := call("alice's sandbox", "GET", "/api/events", ""); code != 200 {
		t.Fatalf("a sandbox's key reads the events: %d", code)
	}
	if code, out := call("bob", "GET", "/api/webhooks", ""); code != 200 || len(out["webhooks"].([]any)) != 0 {
		t.Fatalf("bob lists: %d %v", code, out)
	}
	for _, m := range []string{"GET", "PATCH", "DELETE"} {
		if code, _ := call("bob", m, "/api/webhooks/"+id, `{"enabled":false}`); code != http.StatusNotFound {
			t.Fatalf("bob %s alice's webhook: %d", m, code)
		}
	}
	if code, out := call("alice", "PATCH", "/api/webhooks/"+id, `{"enabled":false}`); code != 200 || out["webhook"].(map[string]any)["enabled"] != false {
		t.Fatalf("disable: %d %v", code, out)
	}
	for body, words := range map[string]string{
		`{}`:                             "url: required",
		`{"url":"http://127.0.0.1:9/x"}`: "url:",
		`{"url":"https://a.example","events":["nope"]}`: "not an event type",
		`{"url":"https://a.example","secret":"short"}`:  "secret:",
		`{"url":7}`: "Expected string",
	} {
		if code, out := call("alice", "POST", "/api/webhooks", body); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), words) {
			t.Errorf("%s: %d %v, want 400 saying %q", body, code, out, words)
		}
	}
	if code, out := call("alice", "GET", "/api/events?type=nope", ""); code != http.StatusBadRequest {
		t.Errorf("an unknown type: %d %v", code, out)
	}
	if code, _ := call("alice", "DELETE", "/api/webhooks/"+id, ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}
}
