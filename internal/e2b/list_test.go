package e2b

import (
	"database/sql"
	"encoding/base64"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestListNeverDropsLive: the list shows every live sandbox of the
// account, v1 whole and v2 page after page, however many sandboxes the
// account has and however many of them ended after the oldest live one
// started, with a metadata filter too. The list used to read the newest
// 1,001 records and filter and page them afterwards.
func TestListNeverDropsLive(t *testing.T) {
	securitytest.Attack(t, "api", "an account with more than a thousand newer sandboxes (ended and live) lists its sandboxes through the E2B API, by metadata and page by page",
		"every live sandbox is listed exactly once: the store selects live ones by status and pages them by a cursor, never cut at a fixed count")
	f := newFixture(t)
	key := map[string]string{"X-API-Key": f.key}
	oldest := f.create(f.key, map[string]any{"metadata": map[string]string{"team": "a"}})
	row, err := f.st.GetSandbox(t.Context(), envd.SandboxID(oldest.SandboxID))
	if err != nil {
		t.Fatal(err)
	}
	const newerLive, newerEnded = 1001, 1100
	start := time.Now().Add(time.Hour)
	if err := f.st.InTx(t.Context(), func(_ *sql.Tx, q *store.Queries) error {
		for i := range newerLive + newerEnded {
			at := start.Add(time.Duration(i) * time.Millisecond)
			sb := store.Sandbox{AccountID: row.AccountID, NodeID: "n1", Status: store.SandboxRunning, Runtime: "fake", CreatedAt: at, Deadline: at.Add(time.Hour)}
			if i%2 == 1 || i >= 2*newerLive {
				sb.Status, sb.StoppedAt = store.SandboxStopped, &at
			}
			if err := q.CreateSandbox(t.Context(), &sb); err != nil {
				return err
			}
			e := store.E2BSandbox{SandboxID: sb.ID, AccountID: row.AccountID, TemplateID: "base",
				Metadata: map[string]string{"team": "b"}, AccessToken: "tok", CreatedAt: at}
			if err := q.CreateE2BSandbox(t.Context(), e); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	var list []listedSandbox
	filter := url.QueryEscape(url.Values{"team": {"a"}}.Encode())
	if resp := f.call("GET", "/sandboxes?metadata="+filter, key, nil, &list); resp.StatusCode != 200 || len(list) != 1 || list[0].SandboxID != oldest.SandboxID {
		t.Fatalf("v1 list with metadata team=a: %d, %d sandboxes; want the oldest alone", resp.StatusCode, len(list))
	}
	if f.call("GET", "/sandboxes", key, nil, &list); !allOnce(t, list, newerLive+1, oldest.SandboxID) {
		t.Fatalf("v1 list: %d sandboxes", len(list))
	}
	var all []listedSandbox
	next := ""
	for pages := 0; ; pages++ {
		if pages > 3 {
			t.Fatal("v2 pages of 1000 never ended")
		}
		list = nil
		resp := f.call("GET", "/v2/sandboxes?limit=1000&nextToken="+url.QueryEscape(next), key, nil, &list)
		if resp.StatusCode != 200 {
			t.Fatalf("v2 page %d: %d", pages, resp.StatusCode)
		}
		all = append(all, list...)
		if next = resp.Header.Get("X-Next-Token"); next == "" {
			break
		}
	}
	if !allOnce(t, all, newerLive+1, oldest.SandboxID) {
		t.Fatalf("v2 pages: %d sandboxes", len(all))
	}
	// A token of the offsets the list used to give is refused, not
	// taken for a place.
	old := base64.RawURLEncoding.EncodeToString([]byte("o:1000"))
	if resp := f.call("GET", "/v2/sandboxes?nextToken="+old, key, nil, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("an offset token: %d, want 400", resp.StatusCode)
	}
}

// allOnce reports whether list has want sandboxes, each once, newest
// first, the last of them last.
func allOnce(t *testing.T, list []listedSandbox, want int, last string) bool {
	t.Helper()
	seen := map[string]bool{}
	for i, sb := range list {
		if seen[sb.SandboxID] {
			t.Errorf("%s listed twice", sb.SandboxID)
			return false
		}
		seen[sb.SandboxID] = true
		if i > 0 && sb.StartedAt.After(list[i-1].StartedAt) {
			t.Errorf("%s (%v) after a sandbox started earlier", sb.SandboxID, sb.StartedAt)
			return false
		}
	}
	if len(list) != want || list[len(list)-1].SandboxID != last {
		t.Logf("%d sandboxes, want %d ending with %s", len(list), want, last)
		return false
	}
	return true
}
