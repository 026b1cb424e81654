package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestNamedSnapshotRoutes: the named snapshot routes over the real
// templates service, with a snapshot recorded as its save leaves it
// (saving one needs a sandbox: e2e/snapshots_test.go): listed in GET
// /api/snapshots' named and never among the templates, found by name and
// id, promoted, deleted; bob sees none of alice's; a create naming both a
// template and a snapshot, or an empty name, is 400.
func TestNamedSnapshotRoutes(t *testing.T) {
	securitytest.Attack(t, "snapshots", "another account lists, reads, promotes or deletes alice's named snapshot through the REST API",
		"404 and an empty list: the routes act on the account the key may act for")
	h, keys, st := templateAPI(t, templates.Config{})
	call := jsonCaller(t, h, keys)
	accounts, err := st.ListAccounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var alice string
	for _, a := range accounts {
		if a.Name == "alice" {
			alice = a.ID
		}
	}
	snap := store.Template{AccountID: alice, Name: "work", Tag: "latest", Status: store.TemplateReady, Source: "sandbox:sbx_one",
		Digest: templates.BuiltinDigest("base-1"), Config: "{}", Kind: store.TemplateKindSnapshot}
	if err := st.CreateTemplate(t.Context(), &snap); err != nil {
		t.Fatal(err)
	}

	code, out := call("alice", "GET", "/api/snapshots", "")
	named, _ := out["named"].([]any)
	if code != 200 || len(named) != 1 {
		t.Fatalf("alice's list: %d %v", code, out)
	}
	if n := named[0].(map[string]any); n["id"] != snap.ID || n["ref"] != "work:latest" || n["sandbox_id"] != "sbx_one" {
		t.Fatalf("named[0] = %v", n)
	}
	if code, out := call("alice", "GET", "/api/snapshots?sandbox_id=sbx_two", ""); code != 200 || len(out["named"].([]any)) != 0 {
		t.Fatalf("another sandbox's: %d %v", code, out)
	}
	if code, out := call("alice", "GET", "/api/templates", ""); code != 200 || len(out["templates"].([]any)) != 0 {
		t.Fatalf("a snapshot among the templates: %v", out)
	}
	for _, ref := range []string{"work", "work:latest", snap.ID} {
		if code, out := call("alice", "GET", "/api/snapshots/"+ref, ""); code != 200 || out["snapshot"].(map[string]any)["id"] != snap.ID {
			t.Fatalf("get %s: %d %v", ref, code, out)
		}
		if code, _ := call("bob", "GET", "/api/snapshots/"+ref, ""); code != http.StatusNotFound {
			t.Fatalf("bob gets %s: %d", ref, code)
		}
		if code, _ := call("bob", "DELETE", "/api/snapshots/"+ref, ""); code != http.StatusNotFound {
			t.Fatalf("bob deletes %s: %d", ref, code)
		}
		if code, _ := call("bob", "POST", "/api/snapshots/"+ref+"/template", `{"name":"stolen"}`); code != http.StatusNotFound {
			t.Fatalf("bob promotes %s: %d", ref, code)
		}
	}
	if code, out := call("bob", "GET", "/api/snapshots", ""); code != 200 || len(out["named"].([]any)) != 0 {
		t.Fatalf("bob's list: %d %v", code, out)
	}
	if code, out := call("alice", "GET", "/api/snapshots/Bad:name", ""); code != http.StatusBadRequest {
		t.Fatalf("a bad name: %d %v", code, out)
	}

	code, out = call("alice", "POST", "/api/snapshots/work/template", `{"name":"tool:v1"}`)
	if code != 200 || out["template"].(map[string]any)["name"] != "tool" {
		t.Fatalf("promote: %d %v", code, out)
	}
	if code, out := call("alice", "POST", "/api/snapshots/work/template", `{"name":"tool:v1"}`); code != http.StatusConflict {
		t.Fatalf("promote again: %d %v", code, out)
	}
	if code, out := call("alice", "POST", "/api/snapshots/work/template", `{}`); code != http.StatusBadRequest {
		t.Fatalf("promote without a name: %d %v", code, out)
	}
	if code, out := call("alice", "GET", "/api/templates", ""); code != 200 || len(out["templates"].([]any)) != 1 {
		t.Fatalf("the promoted template: %v", out)
	}
	if code, out := call("alice", "DELETE", "/api/snapshots/work", ""); code != 200 || out["snapshot"].(map[string]any)["id"] != snap.ID {
		t.Fatalf("delete: %d %v", code, out)
	}
	if code, _ := call("alice", "GET", "/api/snapshots/work", ""); code != http.StatusNotFound {
		t.Fatalf("get after delete: %d", code)
	}

	for body, words := range map[string]string{
		`{"template":"a","snapshot":"b"}`: "Cannot specify both template and snapshot",
		`{"snapshot":""}`:                 "snapshot cannot be empty",
		`{"snapshot":1}`:                  "Expected string",
	} {
		if code, out := call("alice", "POST", "/api/sandboxes", body); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), words) {
			t.Fatalf("create %s: %d %v; want 400 saying %q", body, code, out, words)
		}
	}
	if code, out := call("alice", "POST", "/api/sandboxes/sbx_none/snapshots", `{"name":""}`); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), "name cannot be empty") {
		t.Fatalf("an empty name: %d %v", code, out)
	}
}
