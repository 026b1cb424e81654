package store_test

import (
	"errors"
	"testing"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestDeleteEndedSandbox: one ended sandbox goes at once with its keys;
// a live one, one a queued run still names, and one already gone stay as
// they are.
func TestDeleteEndedSandbox(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		stopped := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopped, t0)
		failed := mustSandbox(t, s, alice.ID, "n1", store.SandboxFailed, t0)
		running := mustSandbox(t, s, alice.ID, "n1", store.SandboxRunning, t0)
		waited := mustSandbox(t, s, alice.ID, "n1", store.SandboxStopped, t0)
		if err := s.CreateRun(ctx, &store.Run{AccountID: alice.ID, SandboxID: waited.ID, Task: "run-sandbox-command", Status: store.RunQueued}); err != nil {
			t.Fatal(err)
		}
		key := store.APIKey{AccountID: alice.ID, Prefix: "sbx_x", Hash: "h1", SandboxID: stopped.ID}
		if err := s.CreateAPIKey(ctx, &key); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			sb   store.Sandbox
			gone bool
		}{{stopped, true}, {failed, true}, {running, false}, {waited, false}, {stopped, false}} {
			ok, err := s.DeleteEndedSandbox(ctx, c.sb.ID)
			if err != nil || ok != c.gone {
				t.Fatalf("delete %s (%s) = %v, %v; want %v", c.sb.ID, c.sb.Status, ok, err, c.gone)
			}
		}
		for _, sb := range []store.Sandbox{running, waited} {
			if _, err := s.GetSandbox(ctx, sb.ID); err != nil {
				t.Errorf("%s: %v, want it kept", sb.ID, err)
			}
		}
		if _, err := s.GetSandbox(ctx, stopped.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the stopped sandbox: %v, want it gone", err)
		}
		if keys, err := s.ListAPIKeys(ctx, alice.ID); err != nil || len(keys) != 0 {
			t.Errorf("its key: %v, %v; want it gone with it", keys, err)
		}
	})
}
