package host

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

func poolSpec(template, base string, layers ...string) runtime.Spec {
	spec := runtime.Spec{Template: template, BaseDir: base, BaseImage: "oci:" + base}
	for _, id := range layers {
		spec.Layers = append(spec.Layers, runtime.Layer{ID: id})
	}
	return spec
}

// testPools are Pools over fakeServed, started from the specs recorded.
type testPools struct {
	*Pools[*fakeServed]
	mu      sync.Mutex
	started []runtime.Spec
	fail    error
	gate    chan struct{} // when set, each start waits for a value
}

func newTestPools(t *testing.T) *testPools {
	tp := &testPools{}
	complete := func(spec *runtime.Spec) {
		if spec.Hostname == "" {
			spec.Hostname = "sandbox"
		}
		if spec.Limits == (runtime.Limits{}) {
			spec.Limits = runtime.Limits{Pids: 512}
		}
	}
	tp.Pools = NewPools(t.Context(), slog.New(slog.DiscardHandler), func(ctx context.Context, spec runtime.Spec) (*fakeServed, error) {
		tp.mu.Lock()
		gate := tp.gate
		tp.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		tp.mu.Lock()
		defer tp.mu.Unlock()
		if spec.ID != "" {
			t.Errorf("a pooled sandbox was started with id %q", spec.ID)
		}
		if tp.fail != nil {
			return nil, tp.fail
		}
		tp.started = append(tp.started, spec)
		return &fakeServed{owner: spec.Template}, nil
	}, complete)
	tp.backoff = Backoff{First: time.Millisecond, Max: 10 * time.Millisecond}
	t.Cleanup(func() { _ = tp.Close() })
	return tp
}

// opener makes spec each time, and counts its releases.
func opener(spec runtime.Spec, released *int, mu *sync.Mutex) func(context.Context) (runtime.Spec, func(), error) {
	return func(context.Context) (runtime.Spec, func(), error) {
		return spec, func() {
			mu.Lock()
			*released++
			mu.Unlock()
		}, nil
	}
}

// waitReady waits until pool name has n ready.
func waitReady(t *testing.T, p *testPools, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, st := range p.Stats().Pools {
			if st.Name == name && st.Ready == n && st.Starting == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: not %d ready: %+v", name, n, p.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPoolsServeOnlyTheirKey(t *testing.T) {
	p := newTestPools(t)
	var mu sync.Mutex
	var released int
	a := poolSpec("tpl_a", "/templates/d1", "sha256:l1", "sha256:l2")
	p.Set("a", 2, opener(a, &released, &mu))
	waitReady(t, p, "a", 2)

	complete := func(s runtime.Spec) runtime.Spec { p.complete(&s); return s }
	// The specs that never get one of a's sandboxes: the built-in image,
	// another template (even on the same directory and layers), other
	// layers, other limits, another hostname, a network, unverified
	// layers.
	others := map[string]runtime.Spec{
		"built-in":          complete(runtime.Spec{BaseDir: "/images/full"}),
		"built-in, same fs": complete(poolSpec("", "/templates/d1", "sha256:l1", "sha256:l2")),
		"template b":        complete(poolSpec("tpl_b", "/templates/d1", "sha256:l1", "sha256:l2")),
		"fewer layers":      complete(poolSpec("tpl_a", "/templates/d1", "sha256:l1")),
		"other layers":      complete(poolSpec("tpl_a", "/templates/d1", "sha256:l1", "sha256:l3")),
		"other base":        complete(poolSpec("tpl_a", "/templates/d2", "sha256:l1", "sha256:l2")),
	}
	lim := complete(a)
	lim.Limits.MemoryBytes = 1 << 30
	others["other limits"] = lim
	host := complete(a)
	host.Hostname = "other"
	others["other hostname"] = host
	netw := complete(a)
	netw.Network = &runtime.Network{Netns: "/run/netns/x"}
	others["a network"] = netw
	unverified := complete(poolSpec("tpl_a", "/templates/d1", "l1", "l2"))
	others["unverified layers"] = unverified
	for what, spec := range others {
		if s, ok := p.Take(t.Context(), spec); ok {
			t.Errorf("%s was handed template a's sandbox %v", what, s)
		}
	}
	// The claim's own (id, owner, environment, home) do not matter: they
	// are written when the sandbox is handed out.
	claim := complete(a)
	claim.ID, claim.Owner, claim.Env, claim.HomeSocket = "sbx_1", "acct", []string{"K=v"}, "/run/home.sock"
	s, ok := p.Take(t.Context(), claim)
	if !ok || s.owner != "tpl_a" {
		t.Fatalf("a's create was not handed a's sandbox: %v %v", s, ok)
	}
	waitReady(t, p, "a", 2) // refilled
	st := p.Stats().Pools[0]
	if st.Hits != 1 || st.Misses != 0 || st.Started != 3 || st.Template != "tpl_a" || st.Size != 2 {
		t.Errorf("stats: %+v", st)
	}
	mu.Lock()
	if released != 3 {
		t.Errorf("released %d of 3 opened specs", released)
	}
	mu.Unlock()
}

func TestPoolsResizeAndRemove(t *testing.T) {
	p := newTestPools(t)
	var mu sync.Mutex
	var released int
	a := poolSpec("tpl_a", "/templates/d1")
	p.Set("a", 3, opener(a, &released, &mu))
	waitReady(t, p, "a", 3)
	p.Set("a", 1, opener(a, &released, &mu))
	waitReady(t, p, "a", 1)
	if st := p.Stats().Pools[0]; st.Discarded != 2 {
		t.Errorf("shrunk from 3 to 1: %d discarded", st.Discarded)
	}
	// A pool's specs change (its template's do not, but the node's
	// limits might): the old sandboxes serve none of the new specs.
	b := a
	b.Limits.CPUs = 2
	p.Set("a", 1, opener(b, &released, &mu))
	c := a
	p.complete(&c)
	if _, ok := p.Take(t.Context(), c); !ok {
		t.Fatal("a ready sandbox was not handed out")
	}
	waitReady(t, p, "a", 1)
	if _, ok := p.Take(t.Context(), c); ok {
		t.Fatal("a sandbox of the new spec served the old one")
	}
	p.complete(&b)
	if _, ok := p.Take(t.Context(), b); !ok {
		t.Fatal("the new spec's sandbox was not handed out")
	}
	waitReady(t, p, "a", 1)
	before := p.Stats().Pools[0]
	p.Set("a", 0, nil)
	rep := p.Stats()
	if len(rep.Pools) != 0 {
		t.Fatalf("removed pool still listed: %+v", rep)
	}
	if rep.Removed.Hits != before.Hits || rep.Removed.Started != before.Started || rep.Removed.Discarded != before.Discarded+1 {
		t.Errorf("the removed pool's counts %+v, before %+v (and its one ready sandbox discarded)", rep.Removed, before)
	}
	if _, ok := p.Take(t.Context(), b); ok {
		t.Fatal("a removed pool handed out a sandbox")
	}
}

func TestPoolsStartFailures(t *testing.T) {
	p := newTestPools(t)
	p.mu.Lock()
	p.fail = errors.New("no room")
	p.mu.Unlock()
	var mu sync.Mutex
	var released int
	a := poolSpec("tpl_a", "/templates/d1")
	p.Set("a", 1, opener(a, &released, &mu))
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Pools[0].Failed < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no retries: %+v", p.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	c := a
	p.complete(&c)
	if _, ok := p.Take(t.Context(), c); ok {
		t.Fatal("a failed pool handed out a sandbox")
	}
	p.mu.Lock()
	p.fail = nil
	p.mu.Unlock()
	waitReady(t, p, "a", 1)
	if _, ok := p.Take(t.Context(), c); !ok {
		t.Fatal("the pool did not recover")
	}
	// A network can never be pooled: the start is refused.
	n := a
	n.Network = &runtime.Network{Netns: "/x"}
	p.Set("n", 1, opener(n, &released, &mu))
	for {
		var failed uint64
		for _, st := range p.Stats().Pools {
			if st.Name == "n" {
				failed = st.Failed
			}
		}
		if failed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a spec with a network was pooled")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPoolsTakeWaitsForAStart: a create that finds its pool's sandbox
// starting waits for it (one create per start); one whose context ends
// first goes cold, and the sandbox stays for the next.
func TestPoolsTakeWaitsForAStart(t *testing.T) {
	p := newTestPools(t)
	var mu sync.Mutex
	var released int
	a := poolSpec("tpl_a", "/templates/d1")
	p.Set("a", 1, opener(a, &released, &mu))
	waitReady(t, p, "a", 1)
	c := a
	p.complete(&c)
	gate := make(chan struct{})
	p.mu.Lock()
	p.gate = gate
	p.mu.Unlock()
	if _, ok := p.Take(t.Context(), c); !ok {
		t.Fatal("the ready sandbox was not handed out")
	}
	// The refill is under way (held at the gate): the next create waits
	// for it, a third one (nothing more starting) goes cold at once.
	deadline := time.Now().Add(5 * time.Second)
	for p.Stats().Pools[0].Starting != 1 {
		if time.Now().After(deadline) {
			t.Fatal("no refill started")
		}
		time.Sleep(time.Millisecond)
	}
	got := make(chan bool)
	go func() {
		_, ok := p.Take(t.Context(), c)
		got <- ok
	}()
	for {
		p.Pools.mu.Lock()
		n := 0
		for _, np := range p.pools {
			n = len(np.waiters)
		}
		p.Pools.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the second create did not wait")
		}
		time.Sleep(time.Millisecond)
	}
	if _, ok := p.Take(t.Context(), c); ok {
		t.Fatal("a third create was handed a sandbox")
	}
	gate <- struct{}{}
	if !<-got {
		t.Fatal("the waiting create was not handed the started sandbox")
	}
	st := p.Stats().Pools[0]
	if st.Hits != 2 || st.Waited != 1 || st.Misses != 1 {
		t.Fatalf("stats %+v: want 2 hits (1 waited), 1 miss", st)
	}
	// A create whose context ends while it waits goes cold; the sandbox
	// it waited for is kept.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, ok := p.Take(ctx, c); ok {
		t.Fatal("a create whose context ended was handed a sandbox")
	}
	p.mu.Lock()
	p.gate = nil
	p.mu.Unlock()
	close(gate)
	waitReady(t, p, "a", 1)
}
