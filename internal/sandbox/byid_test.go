package sandbox

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestEntryPointsByID: every entry point a front end calls loads the
// sandbox under the one access rule, so another account's sandbox, or one
// that does not exist, is not found and left as it was; its own account
// acts on it.
func TestEntryPointsByID(t *testing.T) {
	ctx := context.Background()
	p := newPlane(t, Settings{})
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	bob := store.Account{Name: "bob", Kind: store.AccountPersonal}
	if err := p.st.CreateAccount(ctx, &bob); err != nil {
		t.Fatal(err)
	}
	other := auth.Principal{AccountID: bob.ID}
	calls := map[string]func(auth.Principal, string) error{
		"Stop": func(pr auth.Principal, id string) error { _, err := p.m.Stop(ctx, pr, id); return err },
		"SetTimeout": func(pr auth.Principal, id string) error {
			_, err := p.m.SetTimeout(ctx, pr, id, time.Minute)
			return err
		},
		"Pause":  func(pr auth.Principal, id string) error { _, err := p.m.Pause(ctx, pr, id); return err },
		"Resume": func(pr auth.Principal, id string) error { _, err := p.m.Resume(ctx, pr, id); return err },
		"Fork":   func(pr auth.Principal, id string) error { _, err := p.m.Fork(ctx, pr, id, 1, 0); return err },
		"SetNetwork": func(pr auth.Principal, id string) error {
			_, err := p.m.SetNetwork(ctx, pr, id, netpol.Policy{Mode: netpol.ModeNone})
			return err
		},
		"Delete": func(pr auth.Principal, id string) error { return p.m.Delete(ctx, pr, id) },
		"Exec": func(pr auth.Principal, id string) error {
			_, err := p.m.Exec(ctx, pr, id, ExecRequest{Command: "true"}, io.Discard, io.Discard)
			return err
		},
		"StatPath": func(pr auth.Principal, id string) error { _, _, err := p.m.StatPath(ctx, pr, id, "/"); return err },
		"ArchiveOut": func(pr auth.Principal, id string) error {
			_, err := p.m.ArchiveOut(ctx, pr, id, "/", filecopy.DefaultLimits)
			return err
		},
		"AgentTransport": func(pr auth.Principal, id string) error { _, err := p.m.AgentTransport(ctx, pr, id); return err },
		"Stats":          func(pr auth.Principal, id string) error { _, err := p.m.Stats(ctx, pr, id); return err },
		"Traffic":        func(pr auth.Principal, id string) error { _, err := p.m.Traffic(ctx, pr, id); return err },
		"Ports":          func(pr auth.Principal, id string) error { _, err := p.m.Ports(ctx, pr, id); return err },
		"Processes":      func(pr auth.Principal, id string) error { _, err := p.m.Processes(ctx, pr, id); return err },
		"SignalProcess":  func(pr auth.Principal, id string) error { return p.m.SignalProcess(ctx, pr, id, 1, 9) },
	}
	for name, call := range calls {
		if err := call(other, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s of another account's sandbox: %v, want not found", name, err)
		}
		if err := call(auth.Principal{AccountID: p.account.ID}, "sbx_missing"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s of a missing sandbox: %v, want not found", name, err)
		}
	}
	if got := p.status(t, sb.ID); got.Status != store.SandboxRunning || !got.Deadline.Equal(sb.Deadline) {
		t.Fatalf("after the refused calls: %s, deadline %v; want it untouched", got.Status, got.Deadline)
	}
	own := auth.Principal{AccountID: p.account.ID}
	if _, err := p.m.Exec(ctx, own, sb.ID, ExecRequest{Command: "true"}, io.Discard, io.Discard); err != nil {
		t.Fatalf("exec by its account: %v", err)
	}
	if got, err := p.m.Stop(ctx, own, sb.ID); err != nil || got.Status != store.SandboxStopped {
		t.Fatalf("stop by its account: %v, %v", got.Status, err)
	}
	if err := p.m.Delete(ctx, own, sb.ID); err != nil {
		t.Fatalf("delete by its account: %v", err)
	}
}
