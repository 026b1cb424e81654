package e2b

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestSnapshotRoutes: E2B's snapshot routes in E2B's shapes over the
// templates' snapshots (faked by storeTemplates: package templates' tests
// save real ones): 201 {snapshotID, names}, the list (by sandbox, by name,
// paged), never among GET /templates; another account cannot snapshot,
// list or delete alice's; DELETE /templates/{id} deletes it (204), then
// 404.
func TestSnapshotRoutes(t *testing.T) {
	securitytest.Attack(t, "e2b", "another account snapshots alice's sandbox, or lists or deletes her snapshots, through E2B's routes",
		"404 and an empty list: the sandbox is loaded under the one access rule and the snapshots are the caller's account's")
	f, _ := templateFixture(t)
	alice := map[string]string{"X-API-Key": f.key}
	bob := map[string]string{"X-API-Key": f.account("mallory")}
	sb := f.create(f.key, map[string]any{"templateID": "base"})

	var e envd.Error
	if resp := f.call("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", bob, map[string]any{"name": "x"}, &e); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("mallory snapshots alice's sandbox: %d %+v", resp.StatusCode, e)
	}
	for _, bad := range []string{"", "team/x", "Bad"} {
		if resp := f.call("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", alice, map[string]any{"name": bad}, &e); resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("name %q: %d %+v", bad, resp.StatusCode, e)
		}
	}
	var named, unnamed snapshotInfo
	if resp := f.call("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", alice, map[string]any{"name": "work"}, &named); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	if named.SnapshotID != "work:latest" || len(named.Names) != 1 || named.Names[0] != "work" {
		t.Fatalf("named: %+v", named)
	}
	if resp := f.call("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", alice, nil, &unnamed); resp.StatusCode != http.StatusCreated || len(unnamed.Names) != 0 {
		t.Fatalf("unnamed: %d %+v", resp.StatusCode, unnamed)
	}

	list := func(h map[string]string, query string) ([]snapshotInfo, http.Header) {
		t.Helper()
		var out []snapshotInfo
		resp := f.call("GET", "/snapshots"+query, h, nil, &out)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("list %s: %d", query, resp.StatusCode)
		}
		return out, resp.Header
	}
	if got, _ := list(alice, ""); len(got) != 2 {
		t.Fatalf("alice lists %+v", got)
	}
	if got, _ := list(alice, "?sandboxID="+sb.SandboxID+"&name=work"); len(got) != 1 || got[0].SnapshotID != "work:latest" {
		t.Fatalf("by sandbox and name: %+v", got)
	}
	if got, _ := list(alice, "?sandboxID=nope"); len(got) != 0 {
		t.Fatalf("another sandbox's: %+v", got)
	}
	page, h := list(alice, "?limit=1")
	if len(page) != 1 || h.Get("X-Next-Token") == "" {
		t.Fatalf("page 1: %+v %v", page, h)
	}
	rest, h := list(alice, "?limit=1&nextToken="+h.Get("X-Next-Token"))
	if len(rest) != 1 || rest[0].SnapshotID == page[0].SnapshotID || h.Get("X-Next-Token") != "" {
		t.Fatalf("page 2: %+v after %+v", rest, page)
	}
	if resp := f.call("GET", "/snapshots?nextToken=zz", alice, nil, &e); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a bad token: %d", resp.StatusCode)
	}
	if got, _ := list(bob, ""); len(got) != 0 {
		t.Fatalf("mallory lists %+v", got)
	}
	var tpls []template
	f.call("GET", "/templates", alice, nil, &tpls)
	for _, tpl := range tpls {
		if tpl.Names[0] == "work:latest" {
			t.Fatal("a snapshot is listed among the templates")
		}
	}

	if resp := f.call("DELETE", "/templates/work:latest", bob, nil, &e); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("mallory deletes it: %d", resp.StatusCode)
	}
	if resp := f.call("DELETE", "/templates/"+strings.ReplaceAll(named.SnapshotID, ":", "%3A"), alice, nil, nil); resp.StatusCode != http.StatusNoContent { // the SDK escapes the colon
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	if resp := f.call("DELETE", "/templates/"+named.SnapshotID, alice, nil, &e); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("delete again: %d", resp.StatusCode)
	}
	if got, _ := list(alice, ""); len(got) != 1 || got[0].SnapshotID != unnamed.SnapshotID {
		t.Fatalf("after the delete: %+v", got)
	}
}
