package store_test

import (
	"encoding/json"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// The benchmarks print figures for both dialects; they judge nothing.
//
//	go test -run '^$' -bench . ./internal/store/

func BenchmarkCreateRunParallel(b *testing.B) {
	benchDialects(b, func(b *testing.B, s *store.Store, accountID string) {
		payload := json.RawMessage(`{"command":"ls","args":["-l"]}`)
		b.SetParallelism(4) // 4 × GOMAXPROCS writers
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r := store.Run{AccountID: accountID, Task: "run-sandbox-command", Payload: payload}
				if err := s.CreateRun(b.Context(), &r); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkGetAPIKeyByHashParallel(b *testing.B) {
	benchDialects(b, func(b *testing.B, s *store.Store, accountID string) {
		k := store.APIKey{AccountID: accountID, Name: "k", Prefix: "p", Hash: "00ff"}
		if err := s.CreateAPIKey(b.Context(), &k); err != nil {
			b.Fatal(err)
		}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.GetAPIKeyByHash(b.Context(), "00ff"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func benchDialects(b *testing.B, fn func(b *testing.B, s *store.Store, accountID string)) {
	for _, d := range []struct {
		name string
		dsn  func(testing.TB) string
	}{{"sqlite", storetest.SQLiteDSN}, {"postgres", storetest.PostgresDSN}} {
		b.Run(d.name, func(b *testing.B) {
			s := storetest.Open(b, d.dsn(b))
			a := store.Account{Name: "bench"}
			if err := s.CreateAccount(b.Context(), &a); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			fn(b, s, a.ID)
		})
	}
}
