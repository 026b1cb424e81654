package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// TestTemplateRoutes: the routes over the real templates service (its
// builds are queued, not run): 202 with the template building, fields not
// built yet refused by name, another account's template not found, 409
// for a name and tag taken, the list and the deletion.
func TestTemplateRoutes(t *testing.T) {
	credKey, err := templates.LoadOrCreateKey(filepath.Join(t.TempDir(), "registry-credentials.key"))
	if err != nil {
		t.Fatal(err)
	}
	h, keys, _ := templateAPI(t, templates.Config{CredentialsKey: credKey})
	call := jsonCaller(t, h, keys)

	for body, words := range map[string]string{
		`{"name":"a","image":"registry.example/a","dockerfile":"FROM registry.example/x\nRUN true\n"}`: "image: must be absent with a dockerfile",
		`{"name":"a","image":"registry.example/a","steps":[{"type":"RUN","args":["true"]}]}`:           "cannot run build steps",
		`{"name":"a","image":"registry.example/a","steps":[{"type":"NOPE","args":["x"]}]}`:             "steps[0]",
		`{"name":"a","image":"registry.example/a","steps":"RUN true"}`:                                 "Expected array of steps",
		`{"name":"a","image":"registry.example/a","fromTemplate":"base"}`:                              "image and fromTemplate: give one base",
		`{"name":"a","image":"registry.example/a","registry":{"username":"u"}}`:                        "registry: password: required with a username",
		`{"name":"a","image":"registry.example/a","registry":{"user":"u","password":"p"}}`:             "registry.user: unknown field",
		`{"name":"a","image":"registry.example/a","registry":{"username":1,"password":"p"}}`:           "Expected string",
		`{"name":"a","image":"registry.example/a","registry":"u:p"}`:                                   "Expected object",
		`{"name":"a","image":"registry.example/a","registry":{}}`:                                      "registry: give a username and password, or a token",
		`{"name":"a","dockerfile":"FROM registry.example/x\nCOPY a /a\n"}`:                             "dockerfile: line 2 (COPY): COPY needs a build context",
		`{"name":"a","image":"registry.example/a","context":"` + strings.Repeat("a", 64) + `"}`:        "context: only with a dockerfile",
	} {
		if code, out := call("alice", "POST", "/api/templates", body); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), words) {
			t.Fatalf("%s: %d %v; want 400 saying %q", body, code, out, words)
		}
	}
	if code, out := call("alice", "POST", "/api/templates", `{"name":"Bad","image":"registry.example/a"}`); code != http.StatusBadRequest {
		t.Fatalf("bad name: %d %v", code, out)
	}

	// With credentials: accepted, and answered without them.
	code, out := call("alice", "POST", "/api/templates", `{"name":"private","image":"registry.example/p:1","registry":{"username":"u","password":"pw-in-the-request-55"}}`)
	if code != http.StatusAccepted || strings.Contains(fmt.Sprint(out), "pw-in-the-request-55") {
		t.Fatalf("build with credentials: %d %v", code, out)
	}
	pid := out["template"].(map[string]any)["id"].(string)
	if code, out := call("alice", "GET", "/api/templates/"+pid, ""); code != 200 || strings.Contains(fmt.Sprint(out), "pw-in-the-request-55") {
		t.Fatalf("get with credentials: %d %v", code, out)
	}
	if code, _ := call("alice", "DELETE", "/api/templates/"+pid, ""); code != 200 {
		t.Fatalf("delete: %d", code)
	}

	code, out = call("alice", "POST", "/api/templates", `{"name":"py:3","image":"registry.example/py:3"}`)
	if code != http.StatusAccepted || out["status"] != "success" {
		t.Fatalf("build: %d %v", code, out)
	}
	tpl := out["template"].(map[string]any)
	id := tpl["id"].(string)
	if tpl["status"] != "building" || tpl["name"] != "py" || tpl["tag"] != "3" || tpl["public"] != false || tpl["digest"] != nil || tpl["source"] != "registry.example/py:3" {
		t.Fatalf("template %v", tpl)
	}
	if code, out := call("alice", "POST", "/api/templates", `{"name":"py:3","image":"registry.example/py:3"}`); code != http.StatusConflict {
		t.Fatalf("same name and tag: %d %v", code, out)
	}
	// Over a template: not while it builds; never another account's.
	if code, out := call("alice", "POST", "/api/templates", `{"name":"child","fromTemplate":"`+id+`"}`); code != http.StatusConflict || !strings.Contains(out["error"].(string), "still building") {
		t.Fatalf("over a building template: %d %v", code, out)
	}
	for _, ref := range []string{id, "py:3"} {
		if code, out := call("bob", "POST", "/api/templates", `{"name":"child","fromTemplate":"`+ref+`"}`); code != http.StatusNotFound {
			t.Fatalf("bob over alice's %s: %d %v", ref, code, out)
		}
	}
	code, out = call("alice", "GET", "/api/templates/"+id, "")
	if code != 200 || !strings.Contains(out["template"].(map[string]any)["log"].(string), "queued") {
		t.Fatalf("get: %d %v", code, out)
	}
	if code, out := call("bob", "GET", "/api/templates/"+id, ""); code != http.StatusNotFound || out["error"] != "Template not found" {
		t.Fatalf("bob gets it: %d %v", code, out)
	}
	if code, out := call("bob", "DELETE", "/api/templates/"+id, ""); code != http.StatusNotFound {
		t.Fatalf("bob deletes it: %d %v", code, out)
	}
	if code, out := call("bob", "GET", "/api/templates", ""); code != 200 || len(out["templates"].([]any)) != 0 {
		t.Fatalf("bob lists: %d %v", code, out)
	}
	if code, out := call("alice", "GET", "/api/templates", ""); code != 200 || len(out["templates"].([]any)) != 1 {
		t.Fatalf("alice lists: %d %v", code, out)
	}
	if code, out := call("alice", "DELETE", "/api/templates/"+id, ""); code != 200 || out["template"].(map[string]any)["id"] != id {
		t.Fatalf("delete: %d %v", code, out)
	}
	if code, _ := call("alice", "GET", "/api/templates/"+id, ""); code != http.StatusNotFound {
		t.Fatalf("get after delete: %d", code)
	}
}

// jsonCaller sends JSON requests to h with the key of the account named
// who and answers the status and the decoded body.
func jsonCaller(t *testing.T, h http.Handler, keys map[string]string) func(who, method, path, body string) (int, map[string]any) {
	return func(who, method, path, body string) (int, map[string]any) {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("x-api-key", keys[who])
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, rec.Body)
		}
		return rec.Code, out
	}
}

// templateAPI is the API over the real templates service on a fresh
// store, with accounts alice and bob (keys by name): cfg is the service's
// configuration less what the fixture gives (the store, a job client
// whose builds are queued and never run, the node, the directory).
func templateAPI(t *testing.T, cfg templates.Config) (http.Handler, map[string]string, *store.Store) {
	t.Helper()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	keys := accountKeys(t, st, "alice", "bob")
	jc, err := jobs.New(t.Context(), st, jobs.Config{NodeID: "here"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jc.Close)
	cfg.Store, cfg.Jobs, cfg.NodeID, cfg.Dir = st, jc, "here", filepath.Join(t.TempDir(), "templates")
	svc, err := templates.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Options{Store: st, Auth: auth.NewAuthenticator(st), Version: "test", Templates: svc})
	if err != nil {
		t.Fatal(err)
	}
	return h, keys, st
}

// accountKeys makes a personal account of each name in st and answers a
// key of each, by name.
func accountKeys(t *testing.T, st *store.Store, names ...string) map[string]string {
	t.Helper()
	keys := map[string]string{}
	for _, name := range names {
		a := store.Account{Name: name, Kind: store.AccountPersonal}
		if err := st.CreateAccount(t.Context(), &a); err != nil {
			t.Fatal(err)
		}
		key, prefix, hash, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CreateAPIKey(t.Context(), &store.APIKey{AccountID: a.ID, Prefix: prefix, Hash: hash}); err != nil {
			t.Fatal(err)
		}
		keys[name] = key
	}
	return keys
}
