package store_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestReserveUploadIsAtomic(t *testing.T) {
	securitytest.Attack(t, "storage quotas",
		"10 uploads of one account reserve room for their files at once, on one database as the nodes of a cluster would",
		"reservation and count are one locked transaction: exactly the room of the limit is granted on SQLite and PostgreSQL, the rest are ErrQuota saying what the others hold")
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		const mib = 1 << 20
		reserve := func(id, account string, need, want int64) (store.UploadGrant, error) {
			return s.ReserveUpload(ctx, store.UploadReservation{ID: id, AccountID: account, Need: need, Want: want, Limit: 64 * mib, TTL: time.Minute})
		}
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			granted  int
			refusals []*store.UploadQuotaError
		)
		for i := range 10 {
			wg.Go(func() {
				_, err := reserve(fmt.Sprint("up_", i), "alice", 16*mib, 16*mib)
				mu.Lock()
				defer mu.Unlock()
				var qe *store.UploadQuotaError
				switch {
				case err == nil:
					granted++
				case errors.As(err, &qe) && errors.Is(err, store.ErrQuota):
					refusals = append(refusals, qe)
				default:
					t.Errorf("reserve %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if granted != 4 || len(refusals) != 6 {
			t.Fatalf("%d granted, %d refused; want 4 and 6", granted, len(refusals))
		}
		for _, qe := range refusals {
			if qe.Others != 64*mib || qe.OtherCount != 4 || qe.Limit != 64*mib || qe.Need != 16*mib {
				t.Fatalf("refusal says %+v", qe)
			}
		}
		// Another account has room of its own.
		if _, err := reserve("up_bob", "bob", mib, mib); err != nil {
			t.Fatalf("another account: %v", err)
		}
		// A release gives room back (twice is no error); a grant takes what
		// fits of what it wants when that is at least what it needs.
		var held []string
		for i := range 10 {
			if id := fmt.Sprint("up_", i); s.RenewUpload(ctx, id, time.Minute) == nil {
				held = append(held, id)
			}
		}
		if len(held) != 4 {
			t.Fatalf("%d reservations renewed, want the 4 granted", len(held))
		}
		for _, id := range []string{held[0], held[0], held[1]} {
			if err := s.ReleaseUpload(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		g, err := reserve("up_new", "alice", mib, 64*mib)
		if err != nil || g.Bytes != 32*mib || g.Others != 32*mib || g.OtherCount != 2 {
			t.Fatalf("grant of what fits: %+v, %v", g, err)
		}
		// Growing a reservation counts only the others.
		if g, err := reserve("up_new", "alice", 32*mib, 32*mib); err != nil || g.Bytes != 32*mib {
			t.Fatalf("the same reservation again: %+v, %v", g, err)
		}
		if err := s.RenewUpload(ctx, held[0], time.Minute); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("renew a released reservation: %v", err)
		}
	})
}

func TestUploadReservationsLapse(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		r := store.UploadReservation{ID: "up_dead", AccountID: "alice", Need: 10, Want: 10, Limit: 10, TTL: time.Millisecond}
		if _, err := s.ReserveUpload(ctx, r); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond) // past its TTL: the node that made it died
		if err := s.RenewUpload(ctx, r.ID, time.Minute); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("renew a lapsed reservation: %v", err)
		}
		r.ID, r.TTL = "up_live", time.Minute
		if g, err := s.ReserveUpload(ctx, r); err != nil || g.Others != 0 {
			t.Fatalf("beside a lapsed reservation: %+v, %v", g, err)
		}
		if _, err := s.ReserveUpload(ctx, store.UploadReservation{ID: "x", AccountID: "alice", Need: 2, Want: 1, Limit: 10, TTL: time.Minute}); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("want below need: %v", err)
		}
	})
}
