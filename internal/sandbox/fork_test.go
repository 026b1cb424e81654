package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestFork: the children of a fork are running rows of the parent's
// account that name their parent, each with a key of its own (the
// parent's keeps working), the lifetime asked for, the parent's files; a
// fork past the account's quota makes none; bad counts and lifetimes, a
// stopped parent and a failed runtime fork are refused with the API's
// errors, and a failed fork leaves no child running.
func TestFork(t *testing.T) {
	p := newPlane(t, Settings{MaxTimeout: time.Hour, PerAccount: 4})
	ctx := context.Background()
	parent, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	prsb, _ := p.rt.Get(ctx, parent.ID)
	if err := prsb.WriteFile(ctx, "/workspace/f", strings.NewReader("kept"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		count    int
		lifetime time.Duration
	}{{0, 0}, {MaxForkCount + 1, 0}, {1, 2 * time.Hour}} {
		if _, err := p.m.fork(ctx, parent, tc.count, tc.lifetime); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("fork of %d for %v: %v, want ErrInvalid", tc.count, tc.lifetime, err)
		}
	}

	kids, err := p.m.fork(ctx, parent, 2, 30*time.Minute)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	if len(kids) != 2 {
		t.Fatalf("%d children", len(kids))
	}
	keys := map[string]bool{p.sandboxKey(t, parent.ID): true}
	for _, k := range kids {
		row := p.status(t, k.ID)
		if row.Status != store.SandboxRunning || row.ForkedFrom != parent.ID || row.AccountID != parent.AccountID {
			t.Errorf("child row %+v", row)
		}
		if left := time.Until(row.Deadline); left < 29*time.Minute || left > 30*time.Minute {
			t.Errorf("child lifetime %v, want 30m", left)
		}
		keys[p.sandboxKey(t, k.ID)] = true
		rsb, err := p.rt.Get(ctx, k.ID)
		if err != nil {
			t.Fatal(err)
		}
		rc, err := rsb.ReadFile(ctx, "/workspace/f")
		if err != nil {
			t.Fatalf("child's copy of the parent's file: %v", err)
		}
		rc.Close()
	}
	if len(keys) != 3 {
		t.Errorf("the parent and its 2 children share keys: %d distinct", len(keys))
	}
	for k := range keys {
		if _, err := p.auth.Authenticate(ctx, k); err != nil {
			t.Errorf("a key of the family does not work: %v", err)
		}
	}

	// 3 active of 4: a fork of 2 makes none.
	if _, err := p.m.fork(ctx, parent, 2, 0); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("fork past the quota: %v, want ErrQuota", err)
	}
	if list, _ := p.st.ListSandboxes(ctx, p.account.ID); len(list) != 3 {
		t.Fatalf("%d sandboxes after a refused fork, want 3", len(list))
	}

	// A fork the runtime fails leaves its children failed, their keys
	// revoked, and the parent running.
	p.rt.FailCreate(func(spec runtime.Spec) error { return errors.New("no room") })
	if _, err := p.m.fork(ctx, parent, 1, 0); err == nil {
		t.Fatal("a failed fork succeeded")
	}
	p.rt.FailCreate(nil)
	list, _ := p.st.ListSandboxes(ctx, p.account.ID)
	failed := 0
	for _, sb := range list {
		if sb.ForkedFrom != "" && sb.ID != kids[0].ID && sb.ID != kids[1].ID {
			if sb.Status != store.SandboxFailed {
				t.Errorf("the child of a failed fork is %s", sb.Status)
			}
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d failed children recorded, want 1", failed)
	}
	if cur := p.status(t, parent.ID); cur.Status != store.SandboxRunning {
		t.Fatalf("parent after a failed fork: %s", cur.Status)
	}

	if _, err := p.m.stopByRequest(ctx, p.status(t, parent.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.fork(ctx, p.status(t, parent.ID), 1, 0); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Fatalf("fork of a stopped sandbox: %v, want ErrNotRunning", err)
	}
	// The children outlive their parent.
	for _, k := range kids {
		if cur := p.status(t, k.ID); cur.Status != store.SandboxRunning {
			t.Errorf("child %s after its parent stopped: %s", k.ID, cur.Status)
		}
	}
}
