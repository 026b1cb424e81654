package store_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestOddInputs feeds every method strings that have broken naive SQL or
// placeholder handling. None may panic; lookups by such ids find nothing;
// the data stays intact.
func TestOddInputs(t *testing.T) {
	odd := []string{
		"", "?", "$1", "'", `"`, "'; DROP TABLE accounts; --", "%", "_", "\\", "日本語",
		strings.Repeat("x", 10000), "\x00", "a\x00b", "\xff\xfe",
	}
	// Bytes PostgreSQL cannot store in a UTF-8 text value: an error, but
	// not a panic nor a false "found".
	unstorable := func(s string) bool { return strings.ContainsRune(s, 0) || !utf8.ValidString(s) }

	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		alice := mustAccount(t, s, store.AccountPersonal, "Alice")
		org := mustAccount(t, s, store.AccountOrg, "Org")
		at := time.Now()

		for _, v := range odd {
			lookups := map[string]error{}
			_, lookups["GetAccount"] = s.GetAccount(ctx, v)
			_, lookups["GetAPIKeyByHash"] = s.GetAPIKeyByHash(ctx, v)
			_, lookups["GetAPIKey"] = s.GetAPIKey(ctx, v)
			_, lookups["GetSandbox"] = s.GetSandbox(ctx, v)
			_, lookups["GetRun"] = s.GetRun(ctx, v)
			_, lookups["GetSnapshot"] = s.GetSnapshot(ctx, v)
			_, lookups["GetEnvironment"] = s.GetEnvironment(ctx, v)
			_, lookups["DeleteEnvironment"] = s.DeleteEnvironment(ctx, v)
			lookups["RevokeAPIKey"] = s.RevokeAPIKey(ctx, v, at)
			lookups["SetSandboxDeadline"] = s.SetSandboxDeadline(ctx, v, at)
			lookups["DeleteSnapshot"] = s.DeleteSnapshot(ctx, v)
			lookups["HeartbeatNode"] = s.HeartbeatNode(ctx, v, at)
			lookups["RemoveOrgMember"] = s.RemoveOrgMember(ctx, org.ID, v)
			lookups["SetMembersShareAccess"] = s.SetMembersShareAccess(ctx, v, true)
			lookups["AddOrgMember"] = s.AddOrgMember(ctx, org.ID, v)
			_, lookups["TransitionSandbox"] = s.TransitionSandbox(ctx, v, []store.SandboxStatus{store.SandboxStatus(v), store.SandboxRunning}, store.SandboxStopped, v, at)
			_, lookups["StartRun"] = s.StartRun(ctx, v, at)
			_, lookups["FinishRun"] = s.FinishRun(ctx, v, store.RunCompleted, nil, nil, at)
			for name, err := range lookups {
				if !errors.Is(err, store.ErrNotFound) && !(unstorable(v) && err != nil) {
					t.Errorf("%s(%q): %v, want ErrNotFound", name, v, err)
				}
			}

			// Lists and writes that match nothing, or accept the value.
			_, _ = s.IsOrgMember(ctx, v, v)
			_, _ = s.SharesOrgWithAccess(ctx, v, v)
			_, _ = s.ListOrgsOf(ctx, v)
			_, _ = s.ListMembers(ctx, v)
			_, _ = s.ListAPIKeys(ctx, v)
			_ = s.RevokeSandboxKeys(ctx, v, at)
			_ = s.TouchAPIKey(ctx, v, at)
			_, _ = s.ListSandboxes(ctx, v)
			_, _ = s.ListSandboxesByNode(ctx, v, store.SandboxStatus(v), store.SandboxStatus(v))
			_, _ = s.ListExpiredSandboxes(ctx, v, at)
			_, _ = s.CountActiveSandboxes(ctx, v)
			_ = s.DeleteSandboxesOf(ctx, v)
			_, _ = s.ListRuns(ctx, v, -1)
			_, _ = s.ListRunsByStatus(ctx, store.RunStatus(v))
			_, _ = s.ListSnapshots(ctx, v)
			_, _ = s.DeleteSnapshotsOf(ctx, v)
			_, _ = s.FinishRun(ctx, v, store.RunStatus(v), json.RawMessage(v), json.RawMessage(v), at)

			// Values stored as data come back unchanged.
			a := store.Account{Name: v}
			err := s.CreateAccount(ctx, &a)
			if unstorable(v) && err != nil {
				continue
			}
			if err != nil {
				t.Errorf("CreateAccount(name %q): %v", v, err)
				continue
			}
			got, err := s.GetAccount(ctx, a.ID)
			if err != nil || got.Name != v {
				t.Errorf("account named %q read back as %q, %v", v, got.Name, err)
			}
			r := store.Run{AccountID: alice.ID, Task: v, Tags: []string{v}}
			if err := s.CreateRun(ctx, &r); err != nil {
				t.Errorf("CreateRun(task %q): %v", v, err)
				continue
			}
			// Tags are JSON, which replaces each invalid byte with U+FFFD.
			var wantTag string
			b, _ := json.Marshal(v)
			_ = json.Unmarshal(b, &wantTag)
			gr, err := s.GetRun(ctx, r.ID)
			if err != nil || gr.Task != v || len(gr.Tags) != 1 || gr.Tags[0] != wantTag {
				t.Errorf("run with task %q read back as %q %q, %v", v, gr.Task, gr.Tags, err)
			}
		}
		if _, err := s.GetAccount(ctx, alice.ID); err != nil {
			t.Fatalf("accounts damaged: %v", err)
		}
	})
}
