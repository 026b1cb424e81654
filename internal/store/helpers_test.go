package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// t0 is a fixed time with sub-millisecond digits in a zone other than UTC,
// so that every test also checks the normalization to UTC milliseconds.
var t0 = time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.FixedZone("UTC+2", 2*3600))

// t0ms is t0 as the store returns it.
var t0ms = t0.UTC().Truncate(time.Millisecond)

func mustAccount(t *testing.T, s *store.Store, kind store.AccountKind, name string) store.Account {
	t.Helper()
	return mustAccountAt(t, s, kind, name, time.Time{})
}

// mustAccountAt creates an account created at the given time (now if zero).
func mustAccountAt(t *testing.T, s *store.Store, kind store.AccountKind, name string, created time.Time) store.Account {
	t.Helper()
	a := store.Account{Name: name, Kind: kind, CreatedAt: created}
	if err := s.CreateAccount(t.Context(), &a); err != nil {
		t.Fatalf("CreateAccount(%q): %v", name, err)
	}
	return a
}

func mustSandbox(t *testing.T, s *store.Store, accountID, nodeID string, status store.SandboxStatus, created time.Time) store.Sandbox {
	t.Helper()
	sb := store.Sandbox{AccountID: accountID, NodeID: nodeID, Status: status, Runtime: "gvisor",
		CreatedAt: created, Deadline: created.Add(time.Hour)}
	if err := s.CreateSandbox(t.Context(), &sb); err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	return sb
}

func mustSnapshot(t *testing.T, s *store.Store, accountID, parentID string, created time.Time) store.Snapshot {
	t.Helper()
	sn := store.Snapshot{AccountID: accountID, ParentID: parentID, BaseImage: "base-1", BlobKey: "ab12", Size: 42, CreatedAt: created}
	if err := s.CreateSnapshot(t.Context(), &sn); err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	return sn
}

// wantErr checks that err is (or wraps) want, or is nil when want is nil.
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("%s: unexpected error %v", what, err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}

func ids[T any](rows []T, id func(T) string) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = id(r)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
