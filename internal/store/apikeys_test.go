package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestAPIKeys(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		bob := mustAccount(t, s, store.AccountPersonal, "Bob")
		sb := mustSandbox(t, s, alice.ID, "node-1", store.SandboxRunning, t0)

		expires := t0.Add(24 * time.Hour)
		creates := []struct {
			name string
			in   *store.APIKey
			want error
		}{
			{"full", &store.APIKey{AccountID: alice.ID, Name: "laptop", Prefix: "sbx_abc", Hash: "AA01", CreatedAt: t0, ExpiresAt: &expires}, nil},
			{"second of alice", &store.APIKey{AccountID: alice.ID, Name: "ci", Prefix: "sbx_def", Hash: "bb02", CreatedAt: t0.Add(time.Second)}, nil},
			{"sandbox key", &store.APIKey{AccountID: alice.ID, Name: "sandbox", Prefix: "sbx_s", Hash: "cc03", SandboxID: sb.ID, CreatedAt: t0.Add(2 * time.Second)}, nil},
			{"bob", &store.APIKey{AccountID: bob.ID, Name: "bob", Prefix: "sbx_b", Hash: "dd04"}, nil},
			{"duplicate hash", &store.APIKey{AccountID: bob.ID, Name: "dup", Prefix: "sbx_x", Hash: "aa01"}, store.ErrConflict},
			{"unknown account", &store.APIKey{AccountID: "missing", Name: "x", Prefix: "x", Hash: "ee05"}, store.ErrNotFound},
			{"unknown sandbox", &store.APIKey{AccountID: alice.ID, Name: "x", Prefix: "x", Hash: "ff06", SandboxID: "missing"}, store.ErrNotFound},
			{"empty hash", &store.APIKey{AccountID: alice.ID, Name: "x", Prefix: "x"}, store.ErrInvalid},
			{"nil", nil, store.ErrInvalid},
		}
		keys := map[string]store.APIKey{}
		for _, tt := range creates {
			err := s.CreateAPIKey(ctx, tt.in)
			wantErr(t, "CreateAPIKey "+tt.name, err, tt.want)
			if err == nil {
				keys[tt.name] = *tt.in
			}
		}
		full := keys["full"]
		if full.ID == "" || full.Hash != "aa01" || full.CreatedAt != t0ms || *full.ExpiresAt != expires.UTC().Truncate(time.Millisecond) {
			t.Fatalf("created key not normalized: %+v", full)
		}

		lookups := []struct {
			hash   string
			wantID string
			want   error
		}{
			{"aa01", full.ID, nil},
			{"AA01", full.ID, nil},
			{"cc03", keys["sandbox key"].ID, nil},
			{"0000", "", store.ErrNotFound},
			{"", "", store.ErrNotFound},
		}
		for _, tt := range lookups {
			got, err := s.GetAPIKeyByHash(ctx, tt.hash)
			wantErr(t, "GetAPIKeyByHash("+tt.hash+")", err, tt.want)
			if err == nil && got.ID != tt.wantID {
				t.Errorf("GetAPIKeyByHash(%s) = %s, want %s", tt.hash, got.ID, tt.wantID)
			}
		}
		got, err := s.GetAPIKey(ctx, full.ID)
		if err != nil || got.ID != full.ID || got.Name != "laptop" || got.Prefix != "sbx_abc" || got.AccountID != alice.ID ||
			got.ExpiresAt == nil || !got.ExpiresAt.Equal(*full.ExpiresAt) || got.RevokedAt != nil || got.LastUsedAt != nil {
			t.Fatalf("GetAPIKey = %+v, %v; want %+v", got, err, full)
		}
		if sk, _ := s.GetAPIKey(ctx, keys["sandbox key"].ID); sk.SandboxID != sb.ID {
			t.Errorf("sandbox key SandboxID = %q, want %q", sk.SandboxID, sb.ID)
		}
		_, err = s.GetAPIKey(ctx, "missing")
		wantErr(t, "GetAPIKey(missing)", err, store.ErrNotFound)

		lists := []struct {
			account string
			want    []string
		}{
			{alice.ID, []string{keys["sandbox key"].ID, keys["second of alice"].ID, full.ID}},
			{bob.ID, []string{keys["bob"].ID}},
			{"missing", []string{}},
			{"", []string{keys["bob"].ID, keys["sandbox key"].ID, keys["second of alice"].ID, full.ID}},
		}
		for _, tt := range lists {
			got, err := s.ListAPIKeys(ctx, tt.account)
			if err != nil {
				t.Fatal(err)
			}
			if g := ids(got, func(k store.APIKey) string { return k.ID }); !slices.Equal(g, tt.want) {
				t.Errorf("ListAPIKeys(%q) = %v, want %v", tt.account, g, tt.want)
			}
		}

		// Revocation: first time wins, unknown id is ErrNotFound.
		rev := t0.Add(time.Hour)
		wantErr(t, "RevokeAPIKey", s.RevokeAPIKey(ctx, full.ID, rev), nil)
		wantErr(t, "RevokeAPIKey again", s.RevokeAPIKey(ctx, full.ID, rev.Add(time.Hour)), nil)
		wantErr(t, "RevokeAPIKey(missing)", s.RevokeAPIKey(ctx, "missing", rev), store.ErrNotFound)
		got, _ = s.GetAPIKey(ctx, full.ID)
		if got.RevokedAt == nil || *got.RevokedAt != ms(rev) {
			t.Errorf("RevokedAt = %v, want %v", got.RevokedAt, ms(rev))
		}

		wantErr(t, "RevokeSandboxKeys", s.RevokeSandboxKeys(ctx, sb.ID, rev), nil)
		wantErr(t, "RevokeSandboxKeys(none)", s.RevokeSandboxKeys(ctx, "missing", rev), nil)
		for name, want := range map[string]bool{"sandbox key": true, "second of alice": false, "bob": false} {
			got, _ := s.GetAPIKey(ctx, keys[name].ID)
			if (got.RevokedAt != nil) != want {
				t.Errorf("key %q revoked = %v, want %v", name, got.RevokedAt != nil, want)
			}
		}

		// Touch never moves last_used_at backwards.
		touches := []struct {
			at   time.Time
			want time.Time
		}{
			{t0.Add(time.Minute), t0ms.Add(time.Minute)},
			{t0.Add(3 * time.Minute), t0ms.Add(3 * time.Minute)},
			{t0.Add(2 * time.Minute), t0ms.Add(3 * time.Minute)},
		}
		for _, tt := range touches {
			wantErr(t, "TouchAPIKey", s.TouchAPIKey(ctx, full.ID, tt.at), nil)
			got, _ := s.GetAPIKey(ctx, full.ID)
			if got.LastUsedAt == nil || *got.LastUsedAt != tt.want {
				t.Errorf("after TouchAPIKey(%v): LastUsedAt = %v, want %v", tt.at, got.LastUsedAt, tt.want)
			}
		}
		wantErr(t, "TouchAPIKey(missing)", s.TouchAPIKey(ctx, "missing", t0), nil)

		// A sandbox's keys go with its row.
		wantErr(t, "DeleteSandboxesOf", s.DeleteSandboxesOf(ctx, alice.ID), nil)
		_, err = s.GetAPIKey(ctx, keys["sandbox key"].ID)
		wantErr(t, "GetAPIKey(sandbox key) after DeleteSandboxesOf", err, store.ErrNotFound)
		if _, err := s.GetAPIKey(ctx, full.ID); err != nil {
			t.Errorf("account key gone with the sandboxes: %v", err)
		}
	})
}
