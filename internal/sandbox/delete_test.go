package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestDeleteAStoppedSandbox: a running sandbox is refused with a reason
// until it is stopped; then its row and key go, and a second delete of
// it is not an error.
func TestDeleteAStoppedSandbox(t *testing.T) {
	p := newPlane(t, Settings{})
	ctx := context.Background()
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	key := p.sandboxKey(t, sb.ID)
	if err := p.m.deleteEnded(ctx, sb); !errors.Is(err, errdefs.ErrNotRunning) || !strings.Contains(err.Error(), "Sandbox is running: stop it before deleting it") {
		t.Fatalf("delete of a running sandbox: %v", err)
	}
	stopped, err := p.m.stopByRequest(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.m.deleteEnded(ctx, stopped); err != nil {
		t.Fatalf("delete of a stopped sandbox: %v", err)
	}
	if _, err := p.st.GetSandbox(ctx, sb.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the delete: %v, want it gone", err)
	}
	if p.keyWorks(sb.ID, key) {
		t.Fatal("its key still authenticates")
	}
	if err := p.m.deleteEnded(ctx, stopped); err != nil {
		t.Fatalf("a second delete: %v", err)
	}
}
