package e2b

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestTemplateBuild: the SDK's Template.build calls — request (templateID
// NAME, buildID TAG), start (the template building from the image with
// the steps as sent), status — and the alias and tags reads; bob sees
// none of alice's.
func TestTemplateBuild(t *testing.T) {
	f, _ := templateFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	var req templateRequestResponse
	if resp := f.call("POST", "/v3/templates", key, map[string]any{"name": "web:v1", "cpuCount": 2, "memoryMB": 1024}, &req); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("request: %d", resp.StatusCode)
	}
	if req.TemplateID != "web" || req.BuildID != "v1" || strings.Join(req.Tags, ",") != "v1" || strings.Join(req.Names, ",") != "web:v1" || req.Aliases == nil {
		t.Fatalf("request answered %+v", req)
	}
	// A tag in tags alone is the build's tag; no tag is latest.
	for name, tags := range map[string][]string{"web": {"stable"}, "api": nil} {
		var got templateRequestResponse
		f.call("POST", "/v3/templates", key, map[string]any{"name": name, "tags": tags}, &got)
		want := "latest"
		if tags != nil {
			want = tags[0]
		}
		if got.TemplateID != name || got.BuildID != want {
			t.Errorf("request %s %v: %+v", name, tags, got)
		}
	}

	steps := `[{"type":"RUN","args":["echo hi > /opt/hi","root"],"force":false},{"type":"ENV","args":["K","v"],"force":false}]`
	body := fmt.Sprintf(`{"fromImage":"registry.example/base:1","force":false,"steps":%s,"startCmd":"sleep infinity","readyCmd":"true"}`, steps)
	path := "/v2/templates/" + req.TemplateID + "/builds/" + req.BuildID
	if code, out := f.raw("POST", path, key, body); code != http.StatusAccepted {
		t.Fatalf("start: %d %s", code, out)
	}
	tpl, err := f.st.FindTemplate(t.Context(), f.accountOf(f.key), "web", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Source != "registry.example/base:1" || tpl.Definition != steps+"\nsleep infinity\ntrue" {
		t.Errorf("built %+v", tpl)
	}
	// Started twice: the template exists.
	if code, _ := f.raw("POST", path, key, body); code != http.StatusConflict {
		t.Errorf("second start: %d", code)
	}

	// The build's force (skipCache) is every step's: none is taken from
	// the cache.
	forced := fmt.Sprintf(`{"fromImage":"registry.example/base:1","force":true,"steps":%s}`, steps)
	if code, out := f.raw("POST", "/v2/templates/forced/builds/v1", key, forced); code != http.StatusAccepted {
		t.Fatalf("forced start: %d %s", code, out)
	}
	ftpl, err := f.st.FindTemplate(t.Context(), f.accountOf(f.key), "forced", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(ftpl.Definition, `"force":true`) != 2 || strings.Contains(ftpl.Definition, `"force":false`) {
		t.Errorf("forced build's steps: %s", ftpl.Definition)
	}

	var st buildInfo
	if resp := f.call("GET", "/templates/web/builds/v1/status?logsOffset=0", key, nil, &st); resp.StatusCode != http.StatusOK {
		t.Fatalf("status: %d", resp.StatusCode)
	}
	if st.Status != "building" || len(st.LogEntries) != 1 || st.LogEntries[0].Message != "build of web:v1 queued" || st.LogEntries[0].Timestamp.Year() != 2026 || len(st.Logs) != 1 || st.Reason != nil {
		t.Errorf("status %+v", st)
	}
	// By the template's id too.
	if resp := f.call("GET", "/templates/"+tpl.ID+"/builds/"+tpl.ID+"/status", key, nil, &st); resp.StatusCode != http.StatusOK {
		t.Errorf("status by id: %d", resp.StatusCode)
	}

	var alias aliasResponse
	for _, a := range []string{"web", "web:v1"} {
		if resp := f.call("GET", "/templates/aliases/"+a, key, nil, &alias); resp.StatusCode != http.StatusOK || alias.TemplateID != "web" {
			t.Errorf("alias %s: %d %+v", a, resp.StatusCode, alias)
		}
	}
	var tags []templateTag
	if resp := f.call("GET", "/templates/web/tags", key, nil, &tags); resp.StatusCode != http.StatusOK || len(tags) != 1 || tags[0].Tag != "v1" {
		t.Errorf("tags: %d %+v", resp.StatusCode, tags)
	}

	// Bob: not found, everywhere; the alias does not exist for him.
	other := map[string]string{"X-API-Key": f.otherKey}
	for _, p := range []string{"/templates/web/builds/v1/status", "/templates/" + tpl.ID + "/builds/" + tpl.ID + "/status", "/templates/aliases/web", "/templates/web/tags", "/templates/aliases/nope"} {
		var e envd.Error
		if resp := f.call("GET", p, other, nil, &e); resp.StatusCode != http.StatusNotFound || e.Code != http.StatusNotFound {
			t.Errorf("bob GET %s: %d %+v", p, resp.StatusCode, e)
		}
	}
	// Alice's public-shadowed and public templates are not hers to build
	// over: the public tools is not her alias.
	if resp := f.call("GET", "/templates/aliases/tools", key, nil, nil); resp.StatusCode != http.StatusNotFound {
		t.Errorf("alias of a public template: %d", resp.StatusCode)
	}
}

// TestTemplateBuildStatusPages: the log comes a line an entry, at most
// 100 (and limit) a call, from logsOffset on; a failed build is error
// with its reason.
func TestTemplateBuildStatusPages(t *testing.T) {
	f, _ := templateFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	var log strings.Builder
	for i := range 250 {
		fmt.Fprintf(&log, "2026-01-02T03:04:05Z line %d\n", i)
	}
	tpl := store.Template{AccountID: f.accountOf(f.key), Name: "big", Tag: "latest", Source: "registry.example/x", Status: store.TemplateFailed, FailureReason: "step 2 (RUN false): exit status 1", Log: log.String()}
	if err := f.st.CreateTemplate(t.Context(), &tpl); err != nil {
		t.Fatal(err)
	}
	offset, seen := 0, 0
	for {
		var st buildInfo
		if resp := f.call("GET", fmt.Sprintf("/templates/big/builds/latest/status?logsOffset=%d", offset), key, nil, &st); resp.StatusCode != http.StatusOK {
			t.Fatalf("status at %d: %d", offset, resp.StatusCode)
		}
		if st.Status != "error" || st.Reason == nil || st.Reason.Message != tpl.FailureReason {
			t.Fatalf("status %+v", st)
		}
		if len(st.LogEntries) > 100 {
			t.Fatalf("%d entries in one call", len(st.LogEntries))
		}
		if len(st.LogEntries) == 0 {
			break
		}
		if st.LogEntries[0].Message != fmt.Sprintf("line %d", offset) {
			t.Fatalf("at %d: first entry %q", offset, st.LogEntries[0].Message)
		}
		offset += len(st.LogEntries)
		seen++
	}
	if offset != 250 || seen != 3 {
		t.Errorf("read %d entries in %d calls, want 250 in 3", offset, seen)
	}
	var st buildInfo
	if f.call("GET", "/templates/big/builds/latest/status?logsOffset=10&limit=5", key, nil, &st); len(st.LogEntries) != 5 || st.LogEntries[0].Message != "line 10" {
		t.Errorf("limit 5 at 10: %+v", st.LogEntries)
	}
	if code, _ := f.raw("GET", "/templates/big/builds/latest/status?logsOffset=-1", key, ""); code != http.StatusBadRequest {
		t.Errorf("negative offset: %d", code)
	}
}

// TestTemplateBuildRefusals: what is not built yet is E2B's 400 naming
// it, before anything is recorded; a sandbox's key may not build.
func TestTemplateBuildRefusals(t *testing.T) {
	f, _ := templateFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	for _, c := range []struct {
		method, path, body, msg string
	}{
		{"POST", "/v2/templates/x/builds/latest", `{"fromImage":"registry.example/a","fromTemplate":"base"}`, "give one base, not both"},
		{"POST", "/v2/templates/x/builds/latest", `{"fromImage":"registry.example/a","fromImageRegistry":{"type":"aws","awsAccessKeyId":"k","awsSecretAccessKey":"s","awsRegion":"r"}}`, "fromImageRegistry.type aws: not supported"},
		{"POST", "/v2/templates/x/builds/latest", `{}`, "fromImage or fromTemplate: required"},
		{"POST", "/templates/tags", `{"target":"x:1","tags":["a"]}`, "not supported yet"},
		{"DELETE", "/templates/tags", `{"name":"x","tags":["a"]}`, "not supported yet"},
		{"POST", "/v3/templates", `{"name":"x:1","tags":["2"]}`, "more than one tag"},
		{"POST", "/v3/templates", `{}`, "name: required"},
	} {
		code, out := f.raw(c.method, c.path, key, c.body)
		if code != http.StatusBadRequest || !strings.Contains(out, c.msg) || !strings.Contains(out, `"code":400`) {
			t.Errorf("%s %s %s: %d %s, want 400 with %q", c.method, c.path, c.body, code, out, c.msg)
		}
	}
	if list, _ := f.st.ListTemplates(t.Context(), f.accountOf(f.key)); len(list) != 6 {
		t.Errorf("%d templates after refusals, want the fixture's 6", len(list))
	}

	sb := f.create(f.key, nil)
	sk := map[string]string{"X-API-Key": f.sandboxKey(f.key, sb.SandboxID)}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v3/templates", `{"name":"y"}`},
		{"POST", "/v2/templates/y/builds/latest", `{"fromImage":"registry.example/a"}`},
	} {
		if code, out := f.raw(c.method, c.path, sk, c.body); code != http.StatusForbidden {
			t.Errorf("sandbox key %s %s: %d %s, want 403", c.method, c.path, code, out)
		}
	}
}

// accountOf is the account id of key.
func (f *fixture) accountOf(key string) string {
	f.t.Helper()
	p, err := auth.NewAuthenticator(f.st).Authenticate(f.t.Context(), key)
	if err != nil {
		f.t.Fatal(err)
	}
	return p.AccountID
}

// TestTemplateBuildFromTemplate: the build start's fromTemplate (the SDK's
// Template().fromTemplate(…)) is the templates service's FromTemplate,
// with the steps; fromImage is then absent.
func TestTemplateBuildFromTemplate(t *testing.T) {
	f, _ := templateFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	body := `{"fromTemplate":"py:latest","force":false,"steps":[{"type":"RUN","args":["make"],"force":false}]}`
	if code, out := f.raw("POST", "/v2/templates/over/builds/v1", key, body); code != http.StatusAccepted {
		t.Fatalf("start: %d %s", code, out)
	}
	tpl, err := f.st.FindTemplate(t.Context(), f.accountOf(f.key), "over", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Source != "template:py:latest" || !strings.HasPrefix(tpl.Definition, `[{"type":"RUN","args":["make"],"force":false}]`) {
		t.Errorf("built %+v", tpl)
	}
}
