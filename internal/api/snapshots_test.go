package api

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// TestListSnapshots: the account's snapshot chain, newest first, with the
// current one marked; another account's snapshots never show, and another
// account_id is refused as on every route.
func TestListSnapshots(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := f.st.CreateAccount(ctx, &other); err != nil {
		t.Fatal(err)
	}
	// Nothing yet: an empty list and no current snapshot.
	rec := f.do("GET", "/api/snapshots", ``)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"snapshots":[]`) || !strings.Contains(rec.Body.String(), `"snapshot_id":null`) {
		t.Fatalf("empty: %d %s", rec.Code, rec.Body)
	}
	base := time.Now().Add(-time.Hour)
	first := store.Snapshot{AccountID: f.account.ID, BaseImage: "rootfs:/some/host/path", BlobKey: strings.Repeat("a", 64), Size: 100, Depth: 1, SandboxID: "sbx_one", CreatedAt: base}
	if err := f.st.CreateSnapshot(ctx, &first); err != nil {
		t.Fatal(err)
	}
	second := store.Snapshot{AccountID: f.account.ID, ParentID: first.ID, BaseImage: "rootfs:/some/host/path", BlobKey: strings.Repeat("b", 64), Size: 200, Depth: 2, CreatedAt: base.Add(time.Minute)}
	theirs := store.Snapshot{AccountID: other.ID, BaseImage: "minimal", BlobKey: strings.Repeat("c", 64)}
	for _, sn := range []*store.Snapshot{&second, &theirs} {
		if err := f.st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.st.UpsertEnvironment(ctx, &store.Environment{AccountID: f.account.ID, SnapshotID: &second.ID, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}

	rec = f.do("GET", "/api/snapshots", ``)
	if rec.Code != 200 {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	if strings.Contains(rec.Body.String(), "/some/host/path") || strings.Contains(rec.Body.String(), strings.Repeat("a", 64)) {
		t.Fatalf("the list shows the server's storage details: %s", rec.Body)
	}
	var resp SnapshotsResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.SnapshotID == nil || *resp.SnapshotID != second.ID || resp.ExpiresAt == nil {
		t.Fatalf("current: %s", rec.Body)
	}
	if len(resp.Snapshots) != 2 {
		t.Fatalf("want the account's 2 snapshots, got %s", rec.Body)
	}
	newest, oldest := resp.Snapshots[0], resp.Snapshots[1]
	if newest.ID != second.ID || !newest.Current || newest.ParentID == nil || *newest.ParentID != first.ID || newest.Size != 200 || newest.Depth != 2 || newest.SandboxID != nil {
		t.Errorf("newest: %+v", newest)
	}
	if oldest.ID != first.ID || oldest.Current || oldest.ParentID != nil || oldest.SandboxID == nil || *oldest.SandboxID != "sbx_one" {
		t.Errorf("oldest: %+v", oldest)
	}

	rec = f.do("GET", "/api/snapshots?limit=1", ``)
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || len(resp.Snapshots) != 1 || resp.Snapshots[0].ID != second.ID {
		t.Fatalf("limit=1: %d %s", rec.Code, rec.Body)
	}
	for target, want := range map[string]int{
		"/api/snapshots?limit=0":                400,
		"/api/snapshots?limit=x":                400,
		"/api/snapshots?account_id=nope":        400,
		"/api/snapshots?account_id=" + other.ID: 403,
	} {
		if rec := f.do("GET", target, ``); rec.Code != want {
			t.Errorf("GET %s: %d %s, want %d", target, rec.Code, rec.Body, want)
		}
	}
}
