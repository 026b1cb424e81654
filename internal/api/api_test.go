package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/persist/persisttest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// fixture is an API server on a real SQLite store with one account and key.
type fixture struct {
	st      *store.Store
	srv     *Server
	account store.Account
	key     string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	st := storetest.Open(t, filepath.Join(t.TempDir(), "api.db"))
	ctx := context.Background()
	a := store.Account{Name: "alice", Kind: store.AccountPersonal}
	if err := st.CreateAccount(ctx, &a); err != nil {
		t.Fatal(err)
	}
	plaintext, prefix, hash, err := auth.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateAPIKey(ctx, &store.APIKey{AccountID: a.ID, Prefix: prefix, Hash: hash}); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Store: st, Auth: auth.NewAuthenticator(st), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{st: st, srv: srv, account: a, key: plaintext}
}

// environments is the real owner of the environment rows (internal/persist)
// on the fixture's store, with a GitHub mirror whose owner is "forbidden":
// repositories there other than the account's own mirror are refused. No
// request reaches GitHub (OwnsRepo only reads the URL).
func environments(t *testing.T, st *store.Store) *persist.Service {
	t.Helper()
	gh, err := forge.NewGitHub(forge.Options{Token: "test-token", Owner: "forbidden"})
	if err != nil {
		t.Fatal(err)
	}
	mirror, err := forge.NewMirror(forge.MirrorOptions{Forge: gh, Token: "test-token"})
	if err != nil {
		t.Fatal(err)
	}
	return persisttest.New(t, st, persist.Options{Mirror: mirror})
}

func (f *fixture) do(method, target, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	req.Header.Set("x-api-key", f.key)
	rec := httptest.NewRecorder()
	f.srv.ServeHTTP(rec, req)
	return rec
}

func TestNotAvailableAfterValidation(t *testing.T) {
	f := newFixture(t)
	cases := []struct{ method, path, body string }{
		{"POST", "/api/sandboxes", `{"command":"ls"}`},
		{"DELETE", "/api/sandboxes", ``},
		{"POST", "/api/sandboxes/files", `{"files":[{"url":"https://example.test/a.txt","name":"a.txt"}]}`},
		{"GET", "/api/sandboxes/file?path=README.md", ``},
		{"POST", "/api/tasks/coding-agent", `{"repo_url":"https://example.test/r.git","prompt":"fix it"}`},
	}
	for _, tc := range cases {
		rec := f.do(tc.method, tc.path, tc.body)
		if rec.Code != http.StatusNotImplemented {
			t.Errorf("%s %s: %d %s", tc.method, tc.path, rec.Code, rec.Body)
			continue
		}
		var body map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &body)
		if !reflect.DeepEqual(body, map[string]any{"status": "error", "error": "not available yet"}) {
			t.Errorf("%s %s: body %s", tc.method, tc.path, rec.Body)
		}
	}
}

func TestPatchSnapshot(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &other); err != nil {
		t.Fatal(err)
	}
	mine := store.Snapshot{AccountID: f.account.ID, BaseImage: "minimal", BlobKey: strings.Repeat("a", 64)}
	theirs := store.Snapshot{AccountID: other.ID, BaseImage: "minimal", BlobKey: strings.Repeat("b", 64)}
	for _, sn := range []*store.Snapshot{&mine, &theirs} {
		if err := f.st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	f.srv.opts.Environments = environments(t, f.st)
	// Nothing set yet: the answer is null, not a row.
	rec := f.do("PATCH", "/api/sandboxes", ``)
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != "null" {
		t.Fatalf("empty PATCH: %d %s", rec.Code, rec.Body)
	}
	// A repository alone gives a row without a snapshot: still null, since
	// the published shape types snapshot_id as a string.
	rec = f.do("PATCH", "/api/sandboxes", `{"github_repo":"https://git.example.test/a.git"}`)
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != "null" {
		t.Fatalf("PATCH github_repo only: %d %s", rec.Code, rec.Body)
	}
	// A repository the service refuses is a 400 naming the field.
	rec = f.do("PATCH", "/api/sandboxes", `{"github_repo":"https://github.com/forbidden/x"}`)
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), "github_repo: not the account's repository on the forge: on github.com this account may only name its own mirror") {
		t.Fatalf("PATCH a refused github_repo: %d %s", rec.Code, rec.Body)
	}
	// Another account's snapshot is as unknown as a missing one.
	for _, id := range []string{theirs.ID, "snap_missing"} {
		if rec := f.do("PATCH", "/api/sandboxes", `{"snapshotId":"`+id+`"}`); rec.Code != 404 {
			t.Fatalf("PATCH %s: %d %s", id, rec.Code, rec.Body)
		}
	}
	rec = f.do("PATCH", "/api/sandboxes", `{"snapshotId":"`+mine.ID+`","github_repo":"https://git.example.test/a.git"}`)
	if rec.Code != 200 {
		t.Fatalf("PATCH: %d %s", rec.Code, rec.Body)
	}
	var row map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &row); err != nil || row == nil {
		t.Fatalf("decode %s: %v", rec.Body, err)
	}
	if row["snapshot_id"] != mine.ID || row["github_repo"] != "https://git.example.test/a.git" || row["account_id"] != f.account.ID || row["status"] != nil {
		t.Fatalf("want the raw row, got %s", rec.Body)
	}
	exp, err := time.Parse(time.RFC3339, row["expires_at"].(string))
	if err != nil || time.Until(exp) < 6*24*time.Hour {
		t.Fatalf("expires_at %v", row["expires_at"])
	}
	// The list shows the account's snapshot and repository.
	rec = f.do("GET", "/api/sandboxes", ``)
	var list contract.ListSandboxesResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	if list.SnapshotID == nil || *list.SnapshotID != mine.ID || list.GithubRepo == nil {
		t.Fatalf("list %s", rec.Body)
	}
}

func TestRunsFromStore(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	started := time.Now().Add(-2 * time.Second)
	run := store.Run{AccountID: f.account.ID, Task: "run-sandbox-command", Status: store.RunQueued,
		Payload: json.RawMessage(`{"command":"ls"}`), Tags: []string{"account:" + f.account.ID}}
	if err := f.st.CreateRun(ctx, &run); err != nil {
		t.Fatal(err)
	}
	// durationMs is a number on every run: 0 before it starts, the time so
	// far while it runs.
	durationOf := func() (float64, bool) {
		rec := f.do("GET", "/api/tasks/runs?runId="+run.ID, ``)
		var raw struct {
			Runs []map[string]any `json:"runs"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil || len(raw.Runs) != 1 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		d, ok := raw.Runs[0]["durationMs"].(float64)
		return d, ok
	}
	if d, ok := durationOf(); !ok || d != 0 {
		t.Fatalf("queued run: durationMs %v (number: %v), want 0", d, ok)
	}
	if _, err := f.st.StartRun(ctx, run.ID, started); err != nil {
		t.Fatal(err)
	}
	if d, ok := durationOf(); !ok || d < 1500 {
		t.Fatalf("executing run: durationMs %v (number: %v), want the time since its start", d, ok)
	}
	if _, err := f.st.FinishRun(ctx, run.ID, store.RunCompleted, json.RawMessage(`{"exitCode":0}`), nil, started.Add(1500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	rec := f.do("GET", "/api/tasks/runs?runId="+run.ID, ``)
	var resp contract.RunsResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || len(resp.Runs) != 1 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	got := resp.Runs[0]
	if got.Status != "COMPLETED" || !got.IsCompleted || !got.IsSuccess || got.IsFailed || got.DurationMs != 1500 {
		t.Fatalf("run %+v", got)
	}
	if rec := f.do("GET", "/api/tasks/runs?limit=0", ``); rec.Code != 400 {
		t.Fatalf("limit=0: %d", rec.Code)
	}
	rec = f.do("GET", "/api/tasks/runs?limit=5", ``)
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || len(resp.Runs) != 1 {
		t.Fatalf("list: %s", rec.Body)
	}
}

// FuzzRequests sends arbitrary bodies and queries to every route of a real
// server: nothing may answer 500 or panic.
func FuzzRequests(f *testing.F) {
	srv := newFixture(f)
	routes := srv.srv.routes
	for i := range routes {
		f.Add(uint8(i), []byte(`{"command":"ls"}`), "account_id=x&limit=3&path=a&runId=r")
		f.Add(uint8(i), []byte(`{"files":[{"url":"http://a.test","name":"n"}],"timeout":5}`), "")
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte, query string) {
		rt := routes[int(which)%len(routes)]
		target := strings.ReplaceAll(rt.path, "{id}", "sbx_fuzz") + "?" + query
		req, err := http.NewRequest(rt.method, "http://sandboxd.test"+target, bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("x-api-key", srv.key)
		rec := httptest.NewRecorder()
		srv.srv.ServeHTTP(rec, req)
		if rec.Code >= 500 && rec.Code != http.StatusNotImplemented {
			t.Fatalf("%s %s %q: %d %s", rt.method, target, body, rec.Code, rec.Body)
		}
	})
}
