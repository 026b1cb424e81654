package store_test

import (
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestModelUsage: an account's model usage is counted per UTC day, starts
// each day at zero, is its own (another account's does not mix in), and
// refuses counts that are negative or for an account that does not exist.
func TestModelUsage(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "alice")
		bob := mustAccount(t, s, store.AccountPersonal, "bob")
		// t0 is 13:09 UTC on 2025-03-14; late is the same UTC day in
		// another zone, whose local date is already the 15th.
		day := time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC)
		late := time.Date(2025, 3, 15, 1, 0, 0, 0, time.FixedZone("UTC+12", 12*3600))

		got, err := s.GetModelUsage(ctx, alice.ID, t0)
		if err != nil || got.Requests != 0 || got.Tokens() != 0 || !got.Day.Equal(day) || !got.UpdatedAt.IsZero() {
			t.Fatalf("usage of a fresh day = %+v, %v", got, err)
		}
		steps := []store.ModelUsage{
			{AccountID: alice.ID, Day: t0, Requests: 1, InputTokens: 100, OutputTokens: 20},
			{AccountID: alice.ID, Day: late, Requests: 1, InputTokens: 5},
			{AccountID: bob.ID, Day: t0, Requests: 7, OutputTokens: 7},
		}
		for _, add := range steps {
			if _, err := s.AddModelUsage(ctx, add); err != nil {
				t.Fatalf("add %+v: %v", add, err)
			}
		}
		got, err = s.GetModelUsage(ctx, alice.ID, day.Add(23*time.Hour))
		if err != nil || got.Requests != 2 || got.InputTokens != 105 || got.OutputTokens != 20 || got.Tokens() != 125 || got.UpdatedAt.IsZero() {
			t.Fatalf("alice's day = %+v, %v", got, err)
		}
		if next, err := s.GetModelUsage(ctx, alice.ID, day.Add(24*time.Hour)); err != nil || next.Requests != 0 || next.Tokens() != 0 {
			t.Fatalf("the next day = %+v, %v", next, err)
		}
		for _, bad := range []struct {
			add  store.ModelUsage
			want error
		}{
			{store.ModelUsage{AccountID: alice.ID, Day: t0, Requests: -1}, store.ErrInvalid},
			{store.ModelUsage{AccountID: alice.ID, Day: t0, InputTokens: 1 << 50}, store.ErrInvalid},
			{store.ModelUsage{AccountID: "00000000-0000-0000-0000-000000000000", Day: t0, Requests: 1}, store.ErrNotFound},
		} {
			_, err := s.AddModelUsage(ctx, bad.add)
			wantErr(t, "add bad usage", err, bad.want)
		}
	})
}

// TestModelUsageConcurrentAdds: additions from many nodes at once all
// count, so a budget checked against the row cannot be outrun by spreading
// requests over nodes.
func TestModelUsageConcurrentAdds(t *testing.T) {
	securitytest.Attack(t, "quotas",
		"code in sandboxes of one account calls the model proxy on several nodes at once so that their usage overwrites rather than adds up",
		"every node adds to one row per account and UTC day in one statement: concurrent additions all count")
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		// Two stores on one database: two nodes of a cluster (on
		// SQLite, the server and the admin CLI).
		nodes := []*store.Store{storetest.Open(t, dsn), storetest.Open(t, dsn)}
		a := mustAccount(t, nodes[0], store.AccountPersonal, "alice")
		const n = 40
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if _, err := nodes[i%2].AddModelUsage(t.Context(), store.ModelUsage{AccountID: a.ID, Day: t0, Requests: 1, InputTokens: 1000, OutputTokens: 10}); err != nil {
					t.Errorf("add: %v", err)
				}
			})
		}
		wg.Wait()
		got, err := nodes[1].GetModelUsage(t.Context(), a.ID, t0)
		if err != nil || got.Requests != n || got.InputTokens != n*1000 || got.OutputTokens != n*10 {
			t.Fatalf("after %d concurrent additions: %+v, %v", n, got, err)
		}
	})
}
