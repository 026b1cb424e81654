package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

// testClock is a clock a test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestMaxPaused: a sandbox paused longer than Settings.MaxPaused is
// stopped by its node, its saved state destroyed and its key revoked; one
// paused for less, one running, and one of another node are left alone;
// the bound holds across a restart, and a crash in the middle of such a
// stop is finished by Reconcile; MaxPaused 0 bounds nothing.
func TestMaxPaused(t *testing.T) {
	securitytest.Attack(t, "disk",
		"an account pauses its sandboxes and never resumes them: a paused sandbox's clock stops, so its quota's worth of memory checkpoints would hold the node's disk indefinitely",
		"a sandbox paused longer than --max-paused (default 7 days) is stopped by the node hosting it, its checkpoint deleted and its key revoked; the bound is kept in the database and holds across restarts")
	const week = 7 * 24 * time.Hour
	settings := saveLimits
	settings.MaxPaused = week
	p := newPlane(t, settings)
	clock := &testClock{t: time.Now()}
	p.m.now = clock.now
	ctx := context.Background()
	create := func() store.Sandbox {
		t.Helper()
		sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	pause := func(sb store.Sandbox) {
		t.Helper()
		if _, err := p.m.pause(ctx, p.status(t, sb.ID)); err != nil {
			t.Fatal(err)
		}
	}
	old, running := create(), create()
	key := p.sandboxKey(t, old.ID)
	pause(old)
	clock.add(6 * 24 * time.Hour)
	recent, crashed := create(), create()
	pause(recent)
	pause(crashed)
	// A sandbox of another node, paused for a month: not this node's to stop.
	elsewhere := store.Sandbox{ID: store.NewID("sbx_"), AccountID: p.account.ID, NodeID: "there", Status: store.SandboxRunning, Runtime: "fake", Deadline: clock.now().Add(time.Hour)}
	if err := p.st.CreateSandbox(ctx, &elsewhere); err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.st.BeginPause(ctx, elsewhere.ID, clock.now().Add(-30*24*time.Hour)); !ok {
		t.Fatal("begin pause")
	}
	if ok, _ := p.st.TransitionPause(ctx, elsewhere.ID, []string{store.PausePausing}, store.PausePaused, clock.now()); !ok {
		t.Fatal("paused")
	}

	clock.add(24*time.Hour + time.Minute) // old: 7 days and a minute
	p.m.reapPaused(ctx)
	got := p.status(t, old.ID)
	if got.Status != store.SandboxStopped || !strings.Contains(got.FailureReason, "paused for longer than the server allows (168h0m0s)") {
		t.Fatalf("a sandbox paused past the bound: %s %q, want stopped saying why", got.Status, got.FailureReason)
	}
	if _, err := p.rt.Get(ctx, old.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("its saved state is still on the runtime: %v", err)
	}
	if p.keyWorks(old.ID, key) {
		t.Error("its key still authenticates")
	}
	for id, pause := range map[string]string{recent.ID: store.PausePaused, crashed.ID: store.PausePaused, running.ID: "", elsewhere.ID: store.PausePaused} {
		if cur := p.status(t, id); cur.Status != store.SandboxRunning || cur.Pause != pause {
			t.Errorf("%s is %s/%q, want running/%q", id, cur.Status, cur.Pause, pause)
		}
	}

	// A restart a week later: the bound is in the rows. One stop was
	// claimed when the process died; Reconcile finishes it.
	clock.add(week)
	if ok, err := p.st.BeginStopPaused(ctx, crashed.ID, clock.now().Add(-week), "paused too long", clock.now()); !ok || err != nil {
		t.Fatalf("claim the stop: %v %v", ok, err)
	}
	m := NewManager(p.m.cfg)
	m.diskFreeFn, m.now = p.m.diskFreeFn, clock.now
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	m.reapPaused(ctx)
	for _, id := range []string{recent.ID, crashed.ID} {
		if cur := p.status(t, id); cur.Status != store.SandboxStopped {
			t.Errorf("after the restart %s is %s, want stopped", id, cur.Status)
		}
		if _, err := p.rt.Get(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("after the restart %s's saved state is still on the runtime: %v", id, err)
		}
	}

	// No bound: a pause lasts.
	m.cfg.Settings.MaxPaused = 0
	m.now = clock.now
	lasting, _, err := m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.pause(ctx, lasting); err != nil {
		t.Fatal(err)
	}
	clock.add(365 * 24 * time.Hour)
	m.reapPaused(ctx)
	if cur := p.status(t, lasting.ID); cur.Status != store.SandboxRunning || cur.Pause != store.PausePaused {
		t.Errorf("with no bound a year's pause ends %s/%q", cur.Status, cur.Pause)
	}
}
