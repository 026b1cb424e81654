package store_test

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestE2BSandboxes(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		running := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		older := mustSandbox(t, s, alice.ID, "n2", store.SandboxRunning, t0)
		stopped := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopped, t0)
		bobs := mustSandbox(t, s, bob.ID, "n1", store.SandboxRunning, t0)
		for i, sb := range []store.Sandbox{running, older, stopped, bobs} {
			e := store.E2BSandbox{SandboxID: sb.ID, AccountID: sb.AccountID, TemplateID: "base",
				Metadata: map[string]string{"n": string(rune('a' + i))}, EnvVars: map[string]string{"E": "v"}, AccessToken: "tok-" + sb.ID, TrafficToken: "traffic",
				CreatedAt: t0.Add(time.Duration(-i) * time.Second)}
			if err := s.CreateE2BSandbox(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.GetE2BSandbox(ctx, running.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.AccessToken != "tok-"+running.ID || got.TrafficToken != "traffic" || got.TemplateID != "base" || !maps.Equal(got.Metadata, map[string]string{"n": "a"}) || !maps.Equal(got.EnvVars, map[string]string{"E": "v"}) || got.CreatedAt.UnixMilli() != t0.UnixMilli() {
			t.Fatalf("GetE2BSandbox = %+v", got)
		}
		_, err = s.GetE2BSandbox(ctx, "missing")
		wantErr(t, "GetE2BSandbox", err, store.ErrNotFound)
		// A record needs its sandbox.
		err = s.CreateE2BSandbox(ctx, store.E2BSandbox{SandboxID: "missing", AccountID: alice.ID, TemplateID: "base", AccessToken: "x", CreatedAt: t0})
		if err == nil {
			t.Fatal("CreateE2BSandbox of a sandbox without a row succeeded")
		}

		list, err := s.ListLiveE2BSandboxes(ctx, alice.ID, store.E2BPage{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{running.ID, older.ID}; !slices.Equal(e2bIDs(list), want) {
			t.Fatalf("ListLiveE2BSandboxes = %v, want the live ones newest first %v", e2bIDs(list), want)
		}
		if list, _ := s.ListLiveE2BSandboxes(ctx, alice.ID, store.E2BPage{Limit: 1}); len(list) != 1 {
			t.Fatalf("ListLiveE2BSandboxes with limit 1 = %d rows", len(list))
		}
		// Oldest first, from a cursor, and none created before a time.
		asc, err := s.ListLiveE2BSandboxes(ctx, alice.ID, store.E2BPage{Limit: 10, Ascending: true})
		if want := []string{older.ID, running.ID}; err != nil || !slices.Equal(e2bIDs(asc), want) {
			t.Fatalf("ascending = %v, %v, want %v", e2bIDs(asc), err, want)
		}
		if next, err := s.ListLiveE2BSandboxes(ctx, alice.ID, store.E2BPage{After: asc[0].Cursor(), Limit: 10, Ascending: true}); err != nil || !slices.Equal(e2bIDs(next), []string{running.ID}) {
			t.Fatalf("ascending after the first = %v, %v", e2bIDs(next), err)
		}
		if since, err := s.ListLiveE2BSandboxes(ctx, alice.ID, store.E2BPage{Limit: 10, StartedAfter: t0.Add(-500 * time.Millisecond)}); err != nil || !slices.Equal(e2bIDs(since), []string{running.ID}) {
			t.Fatalf("started after = %v, %v, want only %s", e2bIDs(since), err, running.ID)
		}
		on, err := s.ListLiveE2BSandboxesOn(ctx, "n1")
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(on, func(a, b store.E2BSandbox) int { return a.CreatedAt.Compare(b.CreatedAt) })
		if want := []string{bobs.ID, running.ID}; !slices.Equal(e2bIDs(on), want) {
			t.Fatalf("ListLiveE2BSandboxesOn(n1) = %v, want %v", e2bIDs(on), want)
		}
		byID, err := s.ListSandboxesByID(ctx, []string{running.ID, stopped.ID, "missing"})
		if err != nil || len(byID) != 2 {
			t.Fatalf("ListSandboxesByID = %v, %v, want the 2 that exist", ids(byID, func(sb store.Sandbox) string { return sb.ID }), err)
		}
		if none, err := s.ListSandboxesByID(ctx, nil); err != nil || len(none) != 0 {
			t.Fatalf("ListSandboxesByID(none) = %v, %v", none, err)
		}
		if all, err := s.ListLiveE2BSandboxesOn(ctx, ""); err != nil || len(all) != 3 {
			t.Fatalf("ListLiveE2BSandboxesOn(any node) = %v, %v, want the 3 running", e2bIDs(all), err)
		}
	})
}

func e2bIDs(rows []store.E2BSandbox) []string {
	return ids(rows, func(e store.E2BSandbox) string { return e.SandboxID })
}
