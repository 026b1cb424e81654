package store_test

import (
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestEnvironments(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		snap := mustSnapshot(t, s, alice.ID, "", t0)

		_, err := s.GetEnvironment(ctx, alice.ID)
		wantErr(t, "GetEnvironment(none)", err, store.ErrNotFound)

		repo := "https://example.test/git/alice.git"
		steps := []struct {
			name string
			in   *store.Environment
			want error
			// What GetEnvironment returns afterwards (nil: unchanged).
			wantEnv *store.Environment
		}{
			{"create with repository only", &store.Environment{AccountID: alice.ID, GithubRepo: &repo, ExpiresAt: t0.Add(time.Hour), CreatedAt: t0, UpdatedAt: t0},
				nil, &store.Environment{AccountID: alice.ID, GithubRepo: &repo, ExpiresAt: t0ms.Add(time.Hour), CreatedAt: t0ms, UpdatedAt: t0ms}},
			{"set snapshot keeps created_at", &store.Environment{AccountID: alice.ID, SnapshotID: &snap.ID, GithubRepo: &repo, ExpiresAt: t0.Add(2 * time.Hour), CreatedAt: t0.Add(time.Minute), UpdatedAt: t0.Add(time.Minute)},
				nil, &store.Environment{AccountID: alice.ID, SnapshotID: &snap.ID, GithubRepo: &repo, ExpiresAt: t0ms.Add(2 * time.Hour), CreatedAt: t0ms, UpdatedAt: t0ms.Add(time.Minute)}},
			{"unknown snapshot", &store.Environment{AccountID: alice.ID, SnapshotID: ptr("missing"), ExpiresAt: t0}, store.ErrNotFound, nil},
			{"unknown account", &store.Environment{AccountID: "missing", ExpiresAt: t0}, store.ErrNotFound, nil},
			{"nil", nil, store.ErrInvalid, nil},
		}
		want := store.Environment{}
		for _, tt := range steps {
			err := s.UpsertEnvironment(ctx, tt.in)
			wantErr(t, "UpsertEnvironment "+tt.name, err, tt.want)
			if tt.wantEnv != nil {
				want = *tt.wantEnv
				if !envEqual(*tt.in, want) {
					t.Errorf("%s: upserted row %+v, want %+v", tt.name, *tt.in, want)
				}
			}
			got, err := s.GetEnvironment(ctx, alice.ID)
			if err != nil || !envEqual(got, want) {
				t.Fatalf("%s: GetEnvironment = %+v, %v; want %+v", tt.name, got, err, want)
			}
		}

		got, err := s.DeleteEnvironment(ctx, alice.ID)
		if err != nil || !envEqual(got, want) {
			t.Fatalf("DeleteEnvironment = %+v, %v; want %+v", got, err, want)
		}
		_, err = s.DeleteEnvironment(ctx, alice.ID)
		wantErr(t, "DeleteEnvironment again", err, store.ErrNotFound)
		_, err = s.GetEnvironment(ctx, alice.ID)
		wantErr(t, "GetEnvironment after delete", err, store.ErrNotFound)
		// The snapshot is unreferenced now.
		wantErr(t, "DeleteSnapshot", s.DeleteSnapshot(ctx, snap.ID), nil)
	})
}

func envEqual(a, b store.Environment) bool {
	sp := func(x, y *string) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return a.AccountID == b.AccountID && sp(a.SnapshotID, b.SnapshotID) && sp(a.GithubRepo, b.GithubRepo) &&
		a.ExpiresAt == b.ExpiresAt && a.CreatedAt == b.CreatedAt && a.UpdatedAt == b.UpdatedAt
}

// TestRecentEnvironments: the accounts with a current snapshot, the most
// recently changed first, at most limit; none without a snapshot or with an
// expired one.
func TestRecentEnvironments(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		var ids []string
		for i, name := range []string{"old", "new", "expired", "bare"} {
			a := mustAccount(t, s, store.AccountPersonal, name)
			ids = append(ids, a.ID)
			env := &store.Environment{AccountID: a.ID, ExpiresAt: t0.Add(time.Hour), CreatedAt: t0, UpdatedAt: t0.Add(time.Duration(i) * time.Minute)}
			if name != "bare" {
				snap := mustSnapshot(t, s, a.ID, "", t0)
				env.SnapshotID = &snap.ID
			}
			if name == "expired" {
				env.ExpiresAt = t0
			}
			if err := s.UpsertEnvironment(ctx, env); err != nil {
				t.Fatal(err)
			}
		}
		got, err := s.RecentEnvironments(ctx, 10, t0.Add(time.Second))
		if err != nil || len(got) != 2 || got[0].AccountID != ids[1] || got[1].AccountID != ids[0] {
			t.Fatalf("RecentEnvironments = %+v, %v; want new then old", got, err)
		}
		if got, err := s.RecentEnvironments(ctx, 1, t0.Add(time.Second)); err != nil || len(got) != 1 || got[0].AccountID != ids[1] {
			t.Fatalf("RecentEnvironments(limit 1) = %+v, %v", got, err)
		}
		if got, err := s.RecentEnvironments(ctx, 0, t0); err != nil || len(got) != 0 {
			t.Fatalf("RecentEnvironments(limit 0) = %+v, %v", got, err)
		}
	})
}
