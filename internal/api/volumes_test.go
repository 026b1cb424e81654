package api_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// volumeAPI is the API over the real volumes service on a fresh store,
// with accounts alice and bob (keys and ids by name).
func volumeAPI(t *testing.T, lim volumes.Limits) (http.Handler, map[string]string, map[string]string, *store.Store) {
	t.Helper()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	keys := accountKeys(t, st, "alice", "bob")
	accounts, err := st.ListAccounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, a := range accounts {
		ids[a.Name] = a.ID
	}
	svc, err := volumes.New(volumes.Config{Store: st, NodeID: "here", Dir: filepath.Join(t.TempDir(), "volumes"), Runtime: "gvisor", Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.New(api.Options{Store: st, Auth: auth.NewAuthenticator(st), Version: "test", Volumes: svc})
	if err != nil {
		t.Fatal(err)
	}
	return h, keys, ids, st
}

// TestVolumeRoutes: the volume routes over the real volumes service:
// created with the default size, listed, found by name and id, grown (not
// shrunk), forked, deleted; 409 for a name taken and while attached; bob
// sees none of alice's.
func TestVolumeRoutes(t *testing.T) {
	securitytest.Attack(t, "volumes", "another account lists, reads, resizes, forks or deletes alice's volume through the REST API",
		"404 and an empty list: the routes act on the account the key may act for")
	h, keys, ids, st := volumeAPI(t, volumes.Limits{})
	call := jsonCaller(t, h, keys)

	code, out := call("alice", "POST", "/api/volumes", `{"name":"data"}`)
	if code != 200 || out["status"] != "success" {
		t.Fatalf("create: %d %v", code, out)
	}
	vol := out["volume"].(map[string]any)
	id, _ := vol["id"].(string)
	if !strings.HasPrefix(id, "vol_") || vol["name"] != "data" || vol["size_mb"] != 1024.0 || vol["forked_from"] != "" ||
		vol["microvm_written"] != false || len(vol["attachments"].([]any)) != 0 || vol["created_at"] == "" || vol["updated_at"] == "" {
		t.Fatalf("created volume %v", vol)
	}
	if code, out := call("alice", "POST", "/api/volumes", `{"name":"data","size_mb":128}`); code != http.StatusConflict || !strings.Contains(out["error"].(string), `"data"`) {
		t.Fatalf("a name taken: %d %v", code, out)
	}
	if code, _ := call("bob", "POST", "/api/volumes", `{"name":"data","size_mb":128}`); code != 200 {
		t.Fatalf("bob's own data: %d", code)
	}
	for body, words := range map[string]string{
		`{"name":"-bad"}`:                 "volume name",
		`{"name":"vol_x"}`:                "volume name",
		`{}`:                              "name is required",
		`{"name":"a","size_mb":10}`:       "size_mb must be a whole number of MiB, at least 64",
		`{"name":"a","size_mb":"big"}`:    "Expected number",
		`{"name":"a","account_id":"bob"}`: "account_id must be a valid UUID",
	} {
		if code, out := call("alice", "POST", "/api/volumes", body); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), words) {
			t.Fatalf("create %s: %d %v; want 400 saying %q", body, code, out, words)
		}
	}
	if code, _ := call("bob", "POST", "/api/volumes", `{"name":"x","account_id":"`+ids["alice"]+`"}`); code != http.StatusForbidden {
		t.Fatalf("bob creates for alice: %d", code)
	}

	if code, out := call("alice", "GET", "/api/volumes", ""); code != 200 || len(out["volumes"].([]any)) != 1 {
		t.Fatalf("alice's list: %d %v", code, out)
	}
	if code, out := call("alice", "GET", "/api/volumes?account_id="+ids["alice"], ""); code != 200 || len(out["volumes"].([]any)) != 1 {
		t.Fatalf("alice's list for herself: %d %v", code, out)
	}
	if code, _ := call("alice", "GET", "/api/volumes?account_id=nope", ""); code != http.StatusBadRequest {
		t.Fatalf("a bad account_id: %d", code)
	}
	for _, ref := range []string{"data", id} {
		if code, out := call("alice", "GET", "/api/volumes/"+ref, ""); code != 200 || out["volume"].(map[string]any)["id"] != id {
			t.Fatalf("get %s: %d %v", ref, code, out)
		}
	}
	for _, ref := range []string{id, "nothere"} {
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/api/volumes/" + ref, ""},
			{"PATCH", "/api/volumes/" + ref, `{"size_mb":4096}`},
			{"POST", "/api/volumes/" + ref + "/fork", `{"name":"stolen"}`},
			{"DELETE", "/api/volumes/" + ref, ""},
		} {
			if code, out := call("bob", c.method, c.path, c.body); code != http.StatusNotFound {
				t.Fatalf("bob %s %s: %d %v", c.method, c.path, code, out)
			}
		}
	}
	if code, out := call("bob", "GET", "/api/volumes", ""); code != 200 || len(out["volumes"].([]any)) != 1 || out["volumes"].([]any)[0].(map[string]any)["size_mb"] != 128.0 {
		t.Fatalf("bob's list: %d %v", code, out)
	}

	// Grown, never shrunk; the same size answers it as it is.
	if code, out := call("alice", "PATCH", "/api/volumes/data", `{"size_mb":2048}`); code != 200 || out["volume"].(map[string]any)["size_mb"] != 2048.0 {
		t.Fatalf("resize: %d %v", code, out)
	}
	if code, out := call("alice", "PATCH", "/api/volumes/"+id, `{"size_mb":2048}`); code != 200 || out["volume"].(map[string]any)["size_mb"] != 2048.0 {
		t.Fatalf("resize to its size: %d %v", code, out)
	}
	if code, out := call("alice", "PATCH", "/api/volumes/data", `{"size_mb":1024}`); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), "only grows") {
		t.Fatalf("shrink: %d %v", code, out)
	}
	if code, out := call("alice", "PATCH", "/api/volumes/data", `{}`); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), "size_mb is required") {
		t.Fatalf("resize without a size: %d %v", code, out)
	}

	// Attached read-only to a sandbox: forked, not resized or deleted.
	sb := store.Sandbox{AccountID: ids["alice"], NodeID: "here", Status: store.SandboxRunning, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour),
		Volumes: []store.VolumeAttachment{{VolumeID: id, Path: "/data", ReadOnly: true}}}
	if err := st.CreateSandbox(t.Context(), &sb); err != nil {
		t.Fatal(err)
	}
	code, out = call("alice", "GET", "/api/volumes/data", "")
	if atts := out["volume"].(map[string]any)["attachments"].([]any); code != 200 || len(atts) != 1 {
		t.Fatalf("attached: %d %v", code, out)
	} else if a := atts[0].(map[string]any); a["sandbox_id"] != sb.ID || a["path"] != "/data" || a["read_only"] != true {
		t.Fatalf("attachment %v", a)
	}
	if code, out := call("alice", "PATCH", "/api/volumes/data", `{"size_mb":4096}`); code != http.StatusConflict {
		t.Fatalf("resize while attached: %d %v", code, out)
	}
	if code, out := call("alice", "DELETE", "/api/volumes/data", ""); code != http.StatusConflict || !strings.Contains(out["error"].(string), sb.ID) {
		t.Fatalf("delete while attached: %d %v", code, out)
	}
	code, out = call("alice", "POST", "/api/volumes/data/fork", `{"name":"copy"}`)
	if code != 200 {
		t.Fatalf("fork: %d %v", code, out)
	}
	fork := out["volume"].(map[string]any)
	if fork["name"] != "copy" || fork["forked_from"] != id || fork["size_mb"] != 2048.0 || fork["id"] == id {
		t.Fatalf("fork %v", fork)
	}
	for body, want := range map[string]int{`{"name":"copy"}`: http.StatusConflict, `{"name":"data"}`: http.StatusConflict, `{}`: http.StatusBadRequest, `{"name":"no/slash"}`: http.StatusBadRequest} {
		if code, out := call("alice", "POST", "/api/volumes/data/fork", body); code != want {
			t.Fatalf("fork %s: %d %v, want %d", body, code, out, want)
		}
	}
	if err := st.DetachVolume(t.Context(), sb.ID, id); err != nil {
		t.Fatal(err)
	}

	code, out = call("alice", "DELETE", "/api/volumes/"+id, "")
	if code != 200 || out["volume"].(map[string]any)["id"] != id || out["volume"].(map[string]any)["name"] != "data" {
		t.Fatalf("delete: %d %v", code, out)
	}
	if code, _ := call("alice", "GET", "/api/volumes/data", ""); code != http.StatusNotFound {
		t.Fatalf("get after delete: %d", code)
	}
	code, out = call("alice", "GET", "/api/volumes", "")
	if list := out["volumes"].([]any); code != 200 || len(list) != 1 || list[0].(map[string]any)["name"] != "copy" {
		t.Fatalf("the fork outlives its source: %d %v", code, out)
	}
}

// TestVolumeQuotas: past the account's count or bytes, a create, a
// resize and a fork are 429; one volume past the server's bound is 400.
func TestVolumeQuotas(t *testing.T) {
	h, keys, _, _ := volumeAPI(t, volumes.Limits{Count: 2, Bytes: 3 * volumes.GiB, MaxBytes: 2 * volumes.GiB})
	call := jsonCaller(t, h, keys)
	for _, body := range []string{`{"name":"a"}`, `{"name":"b","size_mb":1536}`} {
		if code, out := call("alice", "POST", "/api/volumes", body); code != 200 {
			t.Fatalf("create %s: %d %v", body, code, out)
		}
	}
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/api/volumes", `{"name":"c","size_mb":64}`, http.StatusTooManyRequests},
		{"POST", "/api/volumes/a/fork", `{"name":"c"}`, http.StatusTooManyRequests},
		{"PATCH", "/api/volumes/a", `{"size_mb":2048}`, http.StatusTooManyRequests},
		{"PATCH", "/api/volumes/a", `{"size_mb":4096}`, http.StatusBadRequest},
	} {
		if code, out := call("alice", c.method, c.path, c.body); code != c.want {
			t.Fatalf("%s %s %s: %d %v, want %d", c.method, c.path, c.body, code, out, c.want)
		}
	}
	if code, out := call("bob", "POST", "/api/volumes", `{"name":"big","size_mb":4096}`); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), "at most 2048 MiB") {
		t.Fatalf("over the server's bound: %d %v", code, out)
	}
}

// TestVolumeRoutesWithoutService: a server without volumes answers 501
// once the request is valid; a create's volumes are checked first.
func TestVolumeRoutesWithoutService(t *testing.T) {
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	keys := accountKeys(t, st, "alice")
	h, err := api.New(api.Options{Store: st, Auth: auth.NewAuthenticator(st), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	call := jsonCaller(t, h, keys)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/volumes", `{"name":"data"}`},
		{"GET", "/api/volumes", ""},
		{"GET", "/api/volumes/data", ""},
		{"PATCH", "/api/volumes/data", `{"size_mb":128}`},
		{"DELETE", "/api/volumes/data", ""},
		{"POST", "/api/volumes/data/fork", `{"name":"copy"}`},
	} {
		if code, out := call("alice", c.method, c.path, c.body); code != http.StatusNotImplemented {
			t.Fatalf("%s %s: %d %v", c.method, c.path, code, out)
		}
	}
	for body, words := range map[string]string{
		`{"volumes":[{"name":"data"}]}`:                                   "Each volume must have a path",
		`{"volumes":{"name":"data","path":"/data"}}`:                      "Expected array",
		`{"volumes":[{"name":"data","path":"/data","read_only":"true"}]}`: "Expected boolean",
	} {
		if code, out := call("alice", "POST", "/api/sandboxes", body); code != http.StatusBadRequest || !strings.Contains(out["error"].(string), words) {
			t.Fatalf("create %s: %d %v; want 400 saying %q", body, code, out, words)
		}
	}
}
