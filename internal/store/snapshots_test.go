package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestSnapshots(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		id := func(sn store.Snapshot) string { return sn.ID }

		creates := []struct {
			name string
			in   *store.Snapshot
			want error
		}{
			{"base", &store.Snapshot{ID: "s1", AccountID: alice.ID, BaseImage: "debian-12", BlobKey: "k1", Size: 1 << 40, Depth: 1, SandboxID: "sb-1", CreatedAt: t0}, nil},
			{"child", &store.Snapshot{ID: "s2", AccountID: alice.ID, ParentID: "s1", BaseImage: "debian-12", BlobKey: "k2", Size: 10, Depth: 2, CreatedAt: t0.Add(time.Second)}, nil},
			{"grandchild", &store.Snapshot{ID: "s3", AccountID: alice.ID, ParentID: "s2", BaseImage: "debian-12", BlobKey: "k3", Size: 10, Depth: 3, CreatedAt: t0.Add(2 * time.Second)}, nil},
			{"other base", &store.Snapshot{ID: "s4", AccountID: alice.ID, BaseImage: "debian-12", BlobKey: "k4", CreatedAt: t0.Add(3 * time.Second)}, nil},
			{"bob's", &store.Snapshot{ID: "b1", AccountID: bob.ID, BaseImage: "debian-12", BlobKey: "k5", CreatedAt: t0.Add(4 * time.Second)}, nil},
			{"generated id", &store.Snapshot{AccountID: bob.ID, BaseImage: "debian-12", BlobKey: "k6"}, nil},
			{"duplicate id", &store.Snapshot{ID: "s1", AccountID: alice.ID, BaseImage: "x", BlobKey: "k"}, store.ErrConflict},
			{"missing parent", &store.Snapshot{AccountID: alice.ID, ParentID: "nope", BaseImage: "x", BlobKey: "k"}, store.ErrNotFound},
			{"missing account", &store.Snapshot{AccountID: "nope", BaseImage: "x", BlobKey: "k"}, store.ErrNotFound},
			{"nil", nil, store.ErrInvalid},
		}
		for _, tt := range creates {
			err := s.CreateSnapshot(ctx, tt.in)
			wantErr(t, "CreateSnapshot "+tt.name, err, tt.want)
			if err != nil {
				continue
			}
			got, err := s.GetSnapshot(ctx, tt.in.ID)
			if err != nil || got != *tt.in {
				t.Fatalf("GetSnapshot(%s) = %+v, %v; want %+v", tt.name, got, err, *tt.in)
			}
		}
		if got, _ := s.GetSnapshot(ctx, "s1"); got.CreatedAt != t0ms || got.Size != 1<<40 {
			t.Errorf("s1 = %+v", got)
		}
		_, err := s.GetSnapshot(ctx, "missing")
		wantErr(t, "GetSnapshot(missing)", err, store.ErrNotFound)

		got, err := s.ListSnapshots(ctx, alice.ID)
		if err != nil {
			t.Fatal(err)
		}
		if g := ids(got, id); !slices.Equal(g, []string{"s4", "s3", "s2", "s1"}) {
			t.Errorf("ListSnapshots(alice) = %v", g)
		}

		// s4 becomes alice's environment's snapshot.
		if err := s.UpsertEnvironment(ctx, &store.Environment{AccountID: alice.ID, SnapshotID: ptr("s4"), ExpiresAt: t0}); err != nil {
			t.Fatal(err)
		}
		unref, err := s.ListUnreferencedSnapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		gen := creates[5].in.ID
		if g := ids(unref, id); !slices.Equal(g, []string{"s3", "b1", gen}) {
			t.Errorf("ListUnreferencedSnapshots = %v, want [s3 b1 %s]", g, gen)
		}

		deletes := []struct {
			id   string
			want error
		}{
			{"s1", store.ErrConflict}, // parent of s2
			{"s4", store.ErrConflict}, // the environment's
			{"missing", store.ErrNotFound},
			{"s3", nil},
			{"s3", store.ErrNotFound},
			{"s2", nil}, // no longer a parent
		}
		for _, tt := range deletes {
			wantErr(t, "DeleteSnapshot("+tt.id+")", s.DeleteSnapshot(ctx, tt.id), tt.want)
		}

		deleted, err := s.DeleteSnapshotsOf(ctx, alice.ID)
		if err != nil {
			t.Fatal(err)
		}
		if g := ids(deleted, id); !slices.Equal(g, []string{"s4", "s1"}) {
			t.Errorf("DeleteSnapshotsOf(alice) = %v, want [s4 s1]", g)
		}
		env, err := s.GetEnvironment(ctx, alice.ID)
		if err != nil || env.SnapshotID != nil {
			t.Errorf("environment after DeleteSnapshotsOf: %+v, %v; want no snapshot", env, err)
		}
		if left, _ := s.ListSnapshots(ctx, bob.ID); len(left) != 2 {
			t.Errorf("bob has %d snapshots left, want 2", len(left))
		}
		deleted, err = s.DeleteSnapshotsOf(ctx, alice.ID)
		if err != nil || len(deleted) != 0 {
			t.Errorf("DeleteSnapshotsOf again = %v, %v; want none", deleted, err)
		}
	})
}
