package e2b

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// volumeFixture serves the API with the real volumes service over the
// fixture's store (its images in a temporary directory; the fake
// sandboxes resolve and release them, and make no disk).
func volumeFixture(t *testing.T, with ...func(*fixtureOptions)) *fixture {
	return newFixture(t, append([]func(*fixtureOptions){func(o *fixtureOptions) {
		svc, err := volumes.New(volumes.Config{Store: o.Store.(*store.Store), NodeID: "n1", Dir: t.TempDir(), Runtime: "gvisor"})
		if err != nil {
			t.Fatal(err)
		}
		o.Volumes = svc
		o.Sandboxes.(*fakeSandboxes).vols = svc
	}}, with...)...)
}

// TestVolumeRoutes: E2B's volume routes in E2B's shapes over sandboxd's
// volumes: create 201 VolumeAndToken (sandboxd's id, the fixed token that
// grants nothing, a domain that sends no content call anywhere), the list,
// get by id (and name), a create with volumeMounts mounting it read-write
// (getInfo names it), delete refused while attached (409), then 204, then
// 404; another account sees, gets, mounts and deletes none of alice's.
func TestVolumeRoutes(t *testing.T) {
	securitytest.Attack(t, "e2b", "another account lists, reads, mounts (volumeMounts) or deletes alice's volume through E2B's /volumes routes and create, by its name or its id",
		"an empty list and 404 everywhere: volumes are looked up within the caller's account")
	f := volumeFixture(t)
	alice := map[string]string{"X-API-Key": f.key}
	bob := map[string]string{"X-API-Key": f.otherKey}

	var v volumeAndToken
	if resp := f.call("POST", "/volumes", alice, map[string]any{"name": "data"}, &v); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %+v", resp.StatusCode, v)
	}
	if !strings.HasPrefix(v.VolumeID, "vol_") || v.Name != "data" || v.Token != volumeContentToken || v.Domain != unservedDomain {
		t.Fatalf("create answered %+v", v)
	}
	info, err := f.api.opts.Volumes.Get(t.Context(), mustAccount(t, f, "alice"), v.VolumeID)
	if err != nil || info.SizeBytes != volumes.DefaultSize {
		t.Fatalf("the volume: %+v %v, want the default size", info, err)
	}
	var e envd.Error
	for _, c := range []struct {
		body any
		code int
		want string
	}{
		{map[string]any{"name": "data"}, http.StatusConflict, `"data"`},
		{map[string]any{}, http.StatusBadRequest, "name: required"},
		{map[string]any{"name": "bad name"}, http.StatusBadRequest, "volume name"},
		{map[string]any{"name": "vol_x"}, http.StatusBadRequest, "volume name"},
	} {
		if resp := f.call("POST", "/volumes", alice, c.body, &e); resp.StatusCode != c.code || e.Code != c.code || !strings.Contains(e.Message, c.want) {
			t.Errorf("create %v: %d %+v, want %d with %q", c.body, resp.StatusCode, e, c.code, c.want)
		}
	}
	var other volumeAndToken
	if resp := f.call("POST", "/volumes", bob, map[string]any{"name": "data"}, &other); resp.StatusCode != http.StatusCreated || other.VolumeID == v.VolumeID {
		t.Fatalf("bob's own data: %d %+v", resp.StatusCode, other)
	}

	var list []volumeInfo
	if resp := f.call("GET", "/volumes", alice, nil, &list); resp.StatusCode != http.StatusOK || !slices.Equal(list, []volumeInfo{v.volumeInfo}) {
		t.Fatalf("alice lists %d %+v", resp.StatusCode, list)
	}
	for _, ref := range []string{v.VolumeID, "data"} {
		var got volumeAndToken
		if resp := f.call("GET", "/volumes/"+ref, alice, nil, &got); resp.StatusCode != http.StatusOK || got != v {
			t.Fatalf("get %s: %d %+v, want %+v", ref, resp.StatusCode, got, v)
		}
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/volumes/" + v.VolumeID},
		{"DELETE", "/volumes/" + v.VolumeID},
		{"GET", "/volumes/vol_nope"},
		{"DELETE", "/volumes/vol_nope"},
	} {
		if resp := f.call(c.method, c.path, bob, nil, &e); resp.StatusCode != http.StatusNotFound || e.Code != http.StatusNotFound {
			t.Fatalf("bob %s %s: %d %+v", c.method, c.path, resp.StatusCode, e)
		}
	}
	// Bob's create naming alice's volume by its id is not found.
	if resp := f.call("POST", "/v2/sandboxes", bob, map[string]any{"volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/data"}}}, &e); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("bob mounts alice's volume: %d %+v", resp.StatusCode, e)
	}

	// The SDK's create: {name, path} for each mount, read-write.
	sb := f.create(f.key, map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "data", "path": "/mnt/data"}}})
	if got := f.sbs.last.Volumes; !slices.Equal(got, []volumes.Mount{{Name: "data", Path: "/mnt/data"}}) {
		t.Fatalf("the manager was asked for volumes %+v", got)
	}
	var detail sandboxDetail
	f.call("GET", "/sandboxes/"+sb.SandboxID, alice, nil, &detail)
	if !slices.Equal(detail.VolumeMounts, []volumeMount{{Name: "data", Path: "/mnt/data"}}) {
		t.Fatalf("getInfo's volumeMounts: %+v", detail.VolumeMounts)
	}
	// One writer at a time: a second create with it is 409.
	if resp := f.call("POST", "/sandboxes", alice, map[string]any{"templateID": "base", "volumeMounts": []any{map[string]any{"name": "data", "path": "/data"}}}, &e); resp.StatusCode != http.StatusConflict || !strings.Contains(e.Message, `volume "data" is attached`) {
		t.Fatalf("a second writer: %d %+v", resp.StatusCode, e)
	}
	if resp := f.call("DELETE", "/volumes/"+v.VolumeID, alice, nil, &e); resp.StatusCode != http.StatusConflict || !strings.Contains(e.Message, "attached") {
		t.Fatalf("delete while attached: %d %+v", resp.StatusCode, e)
	}
	if resp := f.call("DELETE", "/sandboxes/"+sb.SandboxID, alice, nil, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("kill: %d", resp.StatusCode)
	}
	if resp := f.call("DELETE", "/volumes/"+v.VolumeID, alice, nil, nil); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	for _, method := range []string{"GET", "DELETE"} {
		if resp := f.call(method, "/volumes/"+v.VolumeID, alice, nil, &e); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s after the delete: %d %+v", method, resp.StatusCode, e)
		}
	}
	if resp := f.call("GET", "/volumes", alice, nil, &list); resp.StatusCode != http.StatusOK || len(list) != 0 {
		t.Fatalf("alice lists after the delete: %+v", list)
	}
	if resp := f.call("GET", "/volumes", bob, nil, &list); len(list) != 1 || list[0].VolumeID != other.VolumeID {
		t.Fatalf("bob lists %d %+v", resp.StatusCode, list)
	}
}

func mustAccount(t *testing.T, f *fixture, name string) string {
	t.Helper()
	accounts, err := f.st.ListAccounts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range accounts {
		if a.Name == name {
			return a.ID
		}
	}
	t.Fatalf("no account %s", name)
	return ""
}

// TestVolumeMountsRefused: a malformed volumeMounts is 400 naming the
// entry and field, a key E2B's mounts do not have is refused (never
// ignored: a read-only flag would be a promise), and the volumes' own
// checks answer as sandboxd's API does; nothing asked for is no request.
func TestVolumeMountsRefused(t *testing.T) {
	f := volumeFixture(t)
	alice := map[string]string{"X-API-Key": f.key}
	if resp := f.call("POST", "/volumes", alice, map[string]any{"name": "data"}, nil); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d", resp.StatusCode)
	}
	var e envd.Error
	for _, c := range []struct {
		mounts any
		code   int
		want   string
	}{
		{map[string]any{"/data": "data"}, 400, "volumeMounts: want a list of {name, path}"},
		{[]any{"data"}, 400, "volumeMounts[0]: want {name, path}"},
		{[]any{nil}, 400, "volumeMounts[0]: want {name, path}"},
		{[]any{map[string]any{"path": "/data"}}, 400, "volumeMounts[0].name: required"},
		{[]any{map[string]any{"name": "data", "path": "/a"}, map[string]any{"name": "data"}}, 400, "volumeMounts[1].path: required"},
		{[]any{map[string]any{"name": 7, "path": "/data"}}, 400, "volumeMounts[0].name: want a string"},
		{[]any{map[string]any{"name": "data", "path": "/data", "readOnly": true}}, 400, "volumeMounts[0]: readOnly: not supported"},
		{[]any{map[string]any{"name": "data", "path": "data"}}, 400, "volume path"},
		{[]any{map[string]any{"name": "data", "path": "/proc/x"}}, 400, "volume path"},
		{[]any{map[string]any{"name": "data", "path": "/workspace"}}, 400, "repository"},
		{[]any{map[string]any{"name": "data", "path": "/a"}, map[string]any{"name": "data", "path": "/b"}}, 400, "mounted twice"},
		{[]any{map[string]any{"name": "nope", "path": "/data"}}, 404, `volume "nope" not found`},
	} {
		for _, path := range []string{"/sandboxes", "/v2/sandboxes"} {
			body := map[string]any{"templateID": "base", "volumeMounts": c.mounts}
			if resp := f.call("POST", path, alice, body, &e); resp.StatusCode != c.code || e.Code != c.code || !strings.Contains(e.Message, c.want) {
				t.Errorf("POST %s volumeMounts %v: %d %+v, want %d with %q", path, c.mounts, resp.StatusCode, e, c.code, c.want)
			}
		}
	}
	for _, none := range []any{nil, []any{}} {
		f.create(f.key, map[string]any{"templateID": "base", "volumeMounts": none})
		if len(f.sbs.last.Volumes) != 0 {
			t.Fatalf("volumeMounts %v asked for %+v", none, f.sbs.last.Volumes)
		}
	}
}

// TestVolumesOff: a server without volumes lists none, creates, gets and
// deletes none (404), and refuses a create that mounts one.
func TestVolumesOff(t *testing.T) {
	f := newFixture(t)
	alice := map[string]string{"X-API-Key": f.key}
	var list []volumeInfo
	if resp := f.call("GET", "/volumes", alice, nil, &list); resp.StatusCode != http.StatusOK || list == nil || len(list) != 0 {
		t.Fatalf("list: %d %v", resp.StatusCode, list)
	}
	var e envd.Error
	for _, c := range []struct{ method, path string }{{"POST", "/volumes"}, {"GET", "/volumes/vol_x"}, {"DELETE", "/volumes/vol_x"}} {
		if resp := f.call(c.method, c.path, alice, map[string]any{"name": "data"}, &e); resp.StatusCode != http.StatusNotFound || !strings.Contains(e.Message, "no volumes") {
			t.Errorf("%s %s: %d %+v", c.method, c.path, resp.StatusCode, e)
		}
	}
	if resp := f.call("POST", "/v2/sandboxes", alice, map[string]any{"volumeMounts": []any{map[string]any{"name": "data", "path": "/data"}}}, &e); resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Message, "not enabled") {
		t.Fatalf("create with volumes: %d %+v", resp.StatusCode, e)
	}
}

// TestVolumeDomainAndContent: with an E2B domain a volume answers it, so
// that the SDK's content calls (api.DOMAIN) come here; every content call
// is 501 saying why (never 404, a path not found to the SDK), with or
// without a key. A sandbox's own key lists volumes but creates and
// deletes none.
func TestVolumeDomainAndContent(t *testing.T) {
	f := volumeFixture(t, func(o *fixtureOptions) { o.Domain = "sbx.example.test" })
	alice := map[string]string{"X-API-Key": f.key}
	var v volumeAndToken
	if resp := f.call("POST", "/volumes", alice, map[string]any{"name": "data"}, &v); resp.StatusCode != http.StatusCreated || v.Domain != "sbx.example.test" {
		t.Fatalf("create: %d %+v", resp.StatusCode, v)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/volumecontent/" + v.VolumeID + "/dir?path=/"},
		{"PUT", "/volumecontent/" + v.VolumeID + "/file?path=/a"},
		{"GET", "/volumecontent/" + v.VolumeID + "/file?path=/a"},
		{"PATCH", "/volumecontent/" + v.VolumeID + "/path?path=/a"},
		{"DELETE", "/volumecontent/" + v.VolumeID + "/path?path=/a"},
	} {
		for _, h := range []map[string]string{nil, {"Authorization": "Bearer " + v.Token}} {
			code, body := f.raw(c.method, c.path, h, "x")
			if code != http.StatusNotImplemented || !strings.Contains(body, "volume content API is not served") || !strings.Contains(body, `"code":501`) {
				t.Errorf("%s %s: %d %s", c.method, c.path, code, body)
			}
		}
	}
	sb := f.create(f.key, nil)
	sk := map[string]string{"X-API-Key": f.sandboxKey(f.key, sb.SandboxID)}
	var list []volumeInfo
	if resp := f.call("GET", "/volumes", sk, nil, &list); resp.StatusCode != http.StatusOK || len(list) != 1 {
		t.Fatalf("a sandbox's key lists: %d %+v", resp.StatusCode, list)
	}
	var e envd.Error
	if resp := f.call("POST", "/volumes", sk, map[string]any{"name": "more"}, &e); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a sandbox's key creates: %d %+v", resp.StatusCode, e)
	}
	if resp := f.call("DELETE", "/volumes/"+v.VolumeID, sk, nil, &e); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a sandbox's key deletes: %d %+v", resp.StatusCode, e)
	}
}
