package api

import (
	"database/sql"
	"encoding/json"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// sandboxHistory gives the fixture's account, newest first: ended
// sandboxes, then a running, a paused and a stopping one older than all
// of them. It returns the ids newest first and the active ones.
func sandboxHistory(t *testing.T, f *fixture, ended int) (all, active []string) {
	t.Helper()
	ctx := t.Context()
	start := time.Now().Add(-time.Hour)
	if err := f.st.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
		for i, status := range []store.SandboxStatus{store.SandboxStopping, store.SandboxRunning, store.SandboxRunning} {
			sb := store.Sandbox{AccountID: f.account.ID, NodeID: "n1", Status: status, Runtime: "gvisor",
				CreatedAt: start.Add(time.Duration(i) * time.Millisecond), Deadline: start.Add(2 * time.Hour)}
			if err := q.CreateSandbox(ctx, &sb); err != nil {
				return err
			}
			if i == 2 {
				if _, err := q.BeginPause(ctx, sb.ID, start); err != nil {
					return err
				}
			}
			active = append(active, sb.ID)
		}
		for i := range ended {
			at := start.Add(time.Second + time.Duration(i)*time.Millisecond)
			sb := store.Sandbox{AccountID: f.account.ID, NodeID: "n1", Status: store.SandboxStopped, Runtime: "gvisor",
				CreatedAt: at, Deadline: at, StoppedAt: &at}
			if err := q.CreateSandbox(ctx, &sb); err != nil {
				return err
			}
			all = append(all, sb.ID)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	all = append(slices.Clone(active), all...) // oldest first
	slices.Reverse(all)
	slices.Reverse(active)
	return all, active
}

func sandboxIDs(t *testing.T, body []byte) []string {
	t.Helper()
	var resp ListSandboxesResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	ids := make([]string, len(resp.Sandboxes))
	for i, sb := range resp.Sandboxes {
		ids[i] = sb.SandboxID
	}
	return ids
}

// TestListSandboxesUnpagedBounded: without limit and cursor, the list has
// the contract's shape, the account's newest 100 sandboxes and every
// active one however many ended since; it used to list every sandbox the
// account ever had.
func TestListSandboxesUnpagedBounded(t *testing.T) {
	securitytest.Attack(t, "api", "an account that started thousands of sandboxes lists them (GET /api/sandboxes) without paging: one unbounded answer and query",
		"the answer is the newest 100 sandboxes and every active one (running, paused, stopping), in the contract's shape; older ones are read by limit and cursor")
	f := newFixture(t)
	all, active := sandboxHistory(t, f, 250)
	rec := f.do("GET", "/api/sandboxes", ``)
	if rec.Code != 200 || rec.Header().Get(NextCursorHeader) != "" {
		t.Fatalf("%d, next cursor %q", rec.Code, rec.Header().Get(NextCursorHeader))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if keys := slices.Sorted(maps.Keys(raw)); !slices.Equal(keys, []string{"filetree", "github_repo", "sandboxes", "snapshot_id", "status"}) {
		t.Fatalf("keys %v: not the contract's shape", keys)
	}
	want := append(slices.Clone(all[:UnpagedSandboxes]), active...)
	if got := sandboxIDs(t, rec.Body.Bytes()); !slices.Equal(got, want) {
		t.Fatalf("listed %d sandboxes, want the newest %d and the %d active ones", len(got), UnpagedSandboxes, len(active))
	}
	// A filter still finds an old one, and nothing of another account.
	if got := sandboxIDs(t, f.do("GET", "/api/sandboxes?sandbox_id="+all[len(all)-1], ``).Body.Bytes()); !slices.Equal(got, all[len(all)-1:]) {
		t.Fatalf("sandbox_id of the oldest: %v", got)
	}
	if got := sandboxIDs(t, f.do("GET", "/api/sandboxes?sandbox_id=sbx_missing", ``).Body.Bytes()); len(got) != 0 {
		t.Fatalf("sandbox_id of none: %v", got)
	}
}

// TestListSandboxesPaged: limit and cursor page the whole list, newest
// first, each sandbox once; the header names the next page until the last.
func TestListSandboxesPaged(t *testing.T) {
	f := newFixture(t)
	all, _ := sandboxHistory(t, f, 150)
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("pages of 40 never ended")
		}
		target := "/api/sandboxes?limit=40"
		if cursor != "" {
			target += "&cursor=" + url.QueryEscape(cursor)
		}
		rec := f.do("GET", target, ``)
		if rec.Code != 200 {
			t.Fatalf("page %d: %d %s", page, rec.Code, rec.Body)
		}
		ids := sandboxIDs(t, rec.Body.Bytes())
		got = append(got, ids...)
		if cursor = rec.Header().Get(NextCursorHeader); cursor == "" {
			break
		}
		if len(ids) != 40 {
			t.Fatalf("page %d has %d sandboxes and a next page", page, len(ids))
		}
	}
	if !slices.Equal(got, all) {
		t.Fatalf("pages listed %d sandboxes, want all %d newest first", len(got), len(all))
	}
	// A cursor alone pages by 100.
	rec := f.do("GET", "/api/sandboxes?cursor=", ``)
	if ids := sandboxIDs(t, rec.Body.Bytes()); !slices.Equal(ids, all[:100]) || rec.Header().Get(NextCursorHeader) == "" {
		t.Fatalf("cursor alone: %d sandboxes, next %q", len(ids), rec.Header().Get(NextCursorHeader))
	}
	for _, tc := range []struct{ query, msg string }{
		{"limit=0", "limit must be an integer between 1 and 100"},
		{"limit=101", "limit must be an integer between 1 and 100"},
		{"cursor=o:10", "cursor must be the X-Next-Cursor of an earlier page"},
	} {
		rec := f.do("GET", "/api/sandboxes?"+tc.query, ``)
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"error":"`+tc.msg+`"`) {
			t.Errorf("%s: %d %s", tc.query, rec.Code, rec.Body)
		}
	}
}

// TestListRunsPaged: the runs list pages by cursor; each page names the
// next in the header, the body keeps its shape.
func TestListRunsPaged(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	start := time.Now().Add(-time.Hour)
	for i := range 45 {
		run := store.Run{AccountID: f.account.ID, Task: "run-sandbox-command", Status: store.RunCompleted,
			CreatedAt: start.Add(time.Duration(i/3) * time.Second)} // three at a time share a millisecond
		if err := f.st.CreateRun(ctx, &run); err != nil {
			t.Fatal(err)
		}
	}
	all, err := f.st.ListRuns(ctx, f.account.ID, 0)
	if err != nil || len(all) != 45 {
		t.Fatalf("ListRuns = %d runs, %v", len(all), err)
	}
	var want []string
	for _, r := range all {
		want = append(want, r.ID)
	}
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		if page > 3 {
			t.Fatal("pages of 20 never ended")
		}
		rec := f.do("GET", "/api/tasks/runs?cursor="+url.QueryEscape(cursor), ``)
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(rec.Body.Bytes(), &raw); rec.Code != 200 || err != nil || len(raw) != 2 {
			t.Fatalf("page %d: %d %s", page, rec.Code, rec.Body)
		}
		var resp RunsResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Runs {
			got = append(got, r.ID)
		}
		if cursor = rec.Header().Get(NextCursorHeader); cursor == "" {
			break
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages listed %v\nwant %v", got, want)
	}
	if rec := f.do("GET", "/api/tasks/runs?cursor=nope", ``); rec.Code != 400 {
		t.Fatalf("a bad cursor: %d %s", rec.Code, rec.Body)
	}
}
