package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestSaveRefusedUpFront: a pause or fork the runtime says it cannot do
// now (runtime.SaveChecker) is a 409 with the runtime's reason, and
// leaves everything as it was: the sandbox running with its clock going,
// no child recorded, nothing reserved on the node's disk.
func TestSaveRefusedUpFront(t *testing.T) {
	p := newPlane(t, Settings{MaxTimeout: time.Hour, PerAccount: 4})
	ctx := context.Background()
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	p.rt.RefuseSave(fmt.Errorf("%w: a TCP socket is open inside ([::]:8080 LISTEN)", runtime.ErrCannotPause))
	if _, err := p.m.pause(ctx, sb); !errors.Is(err, errdefs.ErrNotRunning) ||
		!strings.Contains(err.Error(), "cannot be paused now: a TCP socket is open inside ([::]:8080 LISTEN)") {
		t.Fatalf("refused pause: %v", err)
	}
	if _, err := p.m.fork(ctx, sb, 2, 0); !errors.Is(err, errdefs.ErrNotRunning) ||
		!strings.Contains(err.Error(), "cannot be forked now: a TCP socket is open inside ([::]:8080 LISTEN)") {
		t.Fatalf("refused fork: %v", err)
	}
	if cur := p.status(t, sb.ID); cur.Status != store.SandboxRunning || cur.Pause != "" || !cur.Deadline.Equal(sb.Deadline) {
		t.Fatalf("after the refusals: %+v", cur)
	}
	if list, _ := p.st.ListSandboxes(ctx, p.account.ID); len(list) != 1 {
		t.Fatalf("%d sandboxes after a refused fork, want the parent alone", len(list))
	}
	if p.m.saving != 0 {
		t.Fatalf("%d bytes reserved after the refusals", p.m.saving)
	}
	p.rt.RefuseSave(nil)
	if _, err := p.m.pause(ctx, p.status(t, sb.ID)); err != nil {
		t.Fatalf("pause once the runtime can: %v", err)
	}
}

// TestSaveWaitsForWorkspace: a pause right after a create waits for the
// preparation of /workspace that the create started (a clone over a
// connection of sandboxd's own) before it saves the sandbox, rather than
// cutting it off or being refused over its socket; so does a fork.
func TestSaveWaitsForWorkspace(t *testing.T) {
	p := newPlane(t, Settings{MaxTimeout: time.Hour, PerAccount: 4})
	ctx := context.Background()
	prep := &blockingPrepare{entered: make(chan string, 4), release: make(chan struct{})}
	p.m.cfg.Persist = prep
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{"pause", "fork"} {
		done := make(chan error, 1)
		go func() {
			var err error
			if what == "pause" {
				_, err = p.m.pause(ctx, p.status(t, sb.ID))
			} else {
				_, err = p.m.fork(ctx, p.status(t, sb.ID), 1, 0)
			}
			done <- err
		}()
		select {
		case id := <-prep.entered:
			if id != sb.ID {
				t.Fatalf("%s prepared %s", what, id)
			}
		case err := <-done:
			t.Fatalf("the %s ended (%v) without waiting for the workspace", what, err)
		}
		rsb, _ := p.rt.Get(ctx, sb.ID)
		if st, _ := rsb.State(ctx); st != runtime.StateRunning {
			t.Fatalf("the %s saved the sandbox while its workspace was being prepared: %s", what, st)
		}
		if list, _ := p.st.ListSandboxes(ctx, p.account.ID); len(list) != 1 {
			t.Fatalf("the %s recorded children while the workspace was being prepared", what)
		}
		prep.release <- struct{}{}
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if what == "pause" {
			if st, _ := rsb.State(ctx); st != runtime.StatePaused {
				t.Fatalf("after the pause: %s", st)
			}
		}
	}
}

// blockingPrepare is a Persistence whose Prepare says it began and waits
// to be released.
type blockingPrepare struct {
	Persistence
	entered chan string
	release chan struct{}
}

func (b *blockingPrepare) Prepare(_ context.Context, sb store.Sandbox, _ runtime.Sandbox, _ bool) error {
	b.entered <- sb.ID
	<-b.release
	return nil
}
