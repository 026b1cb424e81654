package host

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// fakeServed is a started sandbox for Prewarmed's bookkeeping: only
// Destroy, Detach and MarkGone are called on it.
type fakeServed struct {
	runtime.Sandbox
	owner     string
	mu        sync.Mutex
	destroyed int
}

func (f *fakeServed) Destroy(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed++
	return nil
}
func (f *fakeServed) Detach()   {}
func (f *fakeServed) MarkGone() {}

func prewarmSpec(owner string, layers ...string) runtime.Spec {
	spec := runtime.Spec{Owner: owner, BaseDir: "/base", Hostname: "sandbox"}
	for _, id := range layers {
		spec.Layers = append(spec.Layers, runtime.Layer{ID: id})
	}
	return spec
}

func TestPrewarmed(t *testing.T) {
	ctx := context.Background()
	var started []*fakeServed
	p := NewPrewarmed(2, func(_ context.Context, spec runtime.Spec) (*fakeServed, error) {
		if spec.ID != "" {
			t.Errorf("a prewarmed sandbox is started with id %q", spec.ID)
		}
		s := &fakeServed{owner: spec.Owner}
		started = append(started, s)
		return s, nil
	})
	l1, l2 := "sha256:aa", "sha256:bb"
	if _, err := p.Prewarm(ctx, prewarmSpec("a", l1), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prewarm(ctx, prewarmSpec("a", l1), 1); err != nil || len(started) != 1 {
		t.Fatalf("prewarming the same spec again started %d (%v)", len(started), err)
	}
	if _, ok := p.Take(ctx, prewarmSpec("b", l1)); ok {
		t.Fatal("another owner was handed a's sandbox")
	}
	if _, ok := p.Take(ctx, prewarmSpec("a", l1, l2)); ok {
		t.Fatal("a create from other layers was handed the sandbox")
	}
	if started[0].destroyed != 1 || p.Len() != 0 {
		t.Fatalf("the stale sandbox: destroyed %d, %d kept", started[0].destroyed, p.Len())
	}
	// A newer snapshot replaces the owner's sandbox.
	_, _ = p.Prewarm(ctx, prewarmSpec("a", l1), 1)
	_, _ = p.Prewarm(ctx, prewarmSpec("a", l1, l2), 1)
	if started[1].destroyed != 1 || p.Len() != 1 {
		t.Fatalf("replaced: destroyed %d, %d kept", started[1].destroyed, p.Len())
	}
	if s, ok := p.Take(ctx, prewarmSpec("a", l1, l2)); !ok || s != started[2] || s.destroyed != 0 {
		t.Fatalf("take: %v %v", s, ok)
	}
	// The budget drops the least recently prewarmed.
	for _, o := range []string{"x", "y", "x", "z"} {
		_, _ = p.Prewarm(ctx, prewarmSpec(o, l1), 1)
	}
	if p.Len() != 2 {
		t.Fatalf("%d kept within a budget of 2", p.Len())
	}
	if _, ok := p.Take(ctx, prewarmSpec("y", l1)); ok {
		t.Fatal("the least recently prewarmed owner's sandbox was kept")
	}
	// What cannot be prewarmed: no owner, a network, an unverified layer.
	for _, spec := range []runtime.Spec{prewarmSpec("", l1), prewarmSpec("a", "not-a-digest"), {Owner: "a", Network: &runtime.Network{}}} {
		if _, err := p.Prewarm(ctx, spec, 1); !errors.Is(err, ErrNotPrewarmable) {
			t.Errorf("prewarm %+v: %v", spec, err)
		}
	}
	if err := p.Drop(ctx, "z"); err != nil || p.Len() != 1 {
		t.Fatalf("drop: %v, %d kept", err, p.Len())
	}
	if err := p.Close(); err != nil || p.Len() != 0 {
		t.Fatalf("close: %v, %d kept", err, p.Len())
	}
	for _, s := range started {
		if s.owner == "x" && s.destroyed != 1 {
			t.Errorf("close left x's sandbox (destroyed %d)", s.destroyed)
		}
	}
	if _, err := p.Prewarm(ctx, prewarmSpec("a", l1), 1); err == nil {
		t.Error("prewarm after close")
	}
}

// blockingPrewarmed is a Prewarmed whose start of a sandbox from layer
// "sha256:aa" waits for release; entered says when it began.
func blockingPrewarmed() (p *Prewarmed[*fakeServed], entered chan *fakeServed, release chan struct{}) {
	entered, release = make(chan *fakeServed, 1), make(chan struct{})
	p = NewPrewarmed(4, func(_ context.Context, spec runtime.Spec) (*fakeServed, error) {
		s := &fakeServed{owner: spec.Owner}
		if spec.Layers[0].ID == "sha256:aa" {
			entered <- s
			<-release
		}
		return s, nil
	})
	return p, entered, release
}

// TestPrewarmedSuperseded: a sandbox whose prewarm was overtaken while it
// started (the owner's snapshot moved on, or the runtime closed) is
// destroyed, never kept.
func TestPrewarmedSuperseded(t *testing.T) {
	ctx := context.Background()
	p, entered, release := blockingPrewarmed()
	done := make(chan error)
	go func() { _, err := p.Prewarm(ctx, prewarmSpec("a", "sha256:aa"), 1); done <- err }()
	first := <-entered
	// The owner's snapshot moves on while the first one starts.
	if _, err := p.Prewarm(ctx, prewarmSpec("a", "sha256:bb"), 1); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if first.destroyed != 1 || p.Len() != 1 {
		t.Fatalf("the superseded sandbox: destroyed %d, %d kept", first.destroyed, p.Len())
	}
	if _, ok := p.Take(ctx, prewarmSpec("a", "sha256:bb")); !ok {
		t.Fatal("the newer sandbox is not handed out")
	}
}

// TestPrewarmedTakeWaits: a create that finds its sandbox still starting
// is handed it once it runs; one that gives up first leaves it to be
// destroyed, and a stale spec does not drop a newer sandbox that starts.
func TestPrewarmedTakeWaits(t *testing.T) {
	ctx := context.Background()
	p, entered, release := blockingPrewarmed()
	done := make(chan error, 1)
	go func() { _, err := p.Prewarm(ctx, prewarmSpec("a", "sha256:aa"), 1); done <- err }()
	first := <-entered
	if _, ok := p.Take(ctx, prewarmSpec("a", "sha256:old")); ok || p.Len() != 1 {
		t.Fatalf("a create from an older snapshot: handed %v, %d kept (want the starting one kept)", ok, p.Len())
	}
	taken := make(chan *fakeServed)
	go func() {
		s, ok := p.Take(ctx, prewarmSpec("a", "sha256:aa"))
		if !ok {
			s = nil
		}
		taken <- s
	}()
	time.Sleep(20 * time.Millisecond) // let the Take wait
	close(release)
	if s := <-taken; s != first || s.destroyed != 0 {
		t.Fatalf("the waiting create got %v (want the started one, intact)", s)
	}
	if err := <-done; err != nil || p.Len() != 0 {
		t.Fatalf("prewarm: %v, %d kept", err, p.Len())
	}
	if st := p.Stats(); st != (runtime.PrewarmStats{Started: 1, Taken: 1, Waited: 1}) {
		t.Fatalf("stats after a create waited: %+v", st)
	}

	// A create that gives up while it starts.
	p, entered, release = blockingPrewarmed()
	go func() { _, err := p.Prewarm(ctx, prewarmSpec("a", "sha256:aa"), 1); done <- err }()
	second := <-entered
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok := p.Take(gone, prewarmSpec("a", "sha256:aa")); ok {
		t.Fatal("a create that gave up was handed a sandbox")
	}
	close(release)
	if err := <-done; err != nil || second.destroyed != 1 || p.Len() != 0 {
		t.Fatalf("abandoned: %v, destroyed %d, %d kept", err, second.destroyed, p.Len())
	}
	if st := p.Stats(); st != (runtime.PrewarmStats{Started: 1, Discarded: 1}) {
		t.Fatalf("stats after a create gave up: %+v", st)
	}
}

// TestPrewarmedDemand: an owner keeps as many sandboxes as its last
// Prewarm wanted, each started by a call of its own; creates take them one
// at a time; a smaller want gives the ready surplus back; the budget drops
// the least recently prewarmed owner's whole set.
func TestPrewarmedDemand(t *testing.T) {
	ctx := context.Background()
	var started []*fakeServed
	p := NewPrewarmed(4, func(_ context.Context, spec runtime.Spec) (*fakeServed, error) {
		s := &fakeServed{owner: spec.Owner}
		started = append(started, s)
		return s, nil
	})
	prewarm := func(owner string, want int) bool {
		t.Helper()
		ok, err := p.Prewarm(ctx, prewarmSpec(owner, "sha256:aa"), want)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for i := range 3 {
		if !prewarm("a", 3) {
			t.Fatalf("start %d of 3 wanted: none started", i+1)
		}
	}
	if prewarm("a", 3) || p.Len() != 3 {
		t.Fatalf("a fourth of 3 wanted started; %d kept", p.Len())
	}
	for i := range 2 {
		if _, ok := p.Take(ctx, prewarmSpec("a", "sha256:aa")); !ok {
			t.Fatalf("take %d: none handed out", i+1)
		}
	}
	if p.Len() != 1 {
		t.Fatalf("%d kept after two takes of three", p.Len())
	}
	prewarm("a", 3)
	prewarm("a", 3)
	if prewarm("a", 1) || p.Len() != 1 {
		t.Fatalf("want 1 after 3: %d kept", p.Len())
	}
	destroyed := 0
	for _, s := range started {
		destroyed += s.destroyed
	}
	if destroyed != 2 {
		t.Fatalf("the surplus: %d destroyed, want 2", destroyed)
	}
	// a keeps 3; b's 2nd start would make 5 of a budget of 4: a's go.
	prewarm("a", 3)
	prewarm("a", 3)
	prewarm("b", 2)
	prewarm("b", 2)
	if p.Len() != 2 {
		t.Fatalf("%d kept after b's starts, want b's 2", p.Len())
	}
	if _, ok := p.Take(ctx, prewarmSpec("a", "sha256:aa")); ok {
		t.Fatal("a's evicted sandboxes are still handed out")
	}
	// A want past the budget is the budget.
	for prewarm("c", 10) {
	}
	if p.Len() != 4 {
		t.Fatalf("want 10 of a budget of 4: %d kept", p.Len())
	}
	if st := p.Stats(); st.Kept != 4 || st.Taken != 2 || st.Started != uint64(len(started)) {
		t.Fatalf("stats %+v (%d started)", st, len(started))
	}
}
