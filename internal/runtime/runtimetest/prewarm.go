package runtimetest

import (
	"bytes"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testPrewarm: a sandbox prewarmed from an owner's layers is handed to
// that owner's next create with the same layers, and to nothing else: not
// another owner's create with the same layers, not the owner's create from
// other layers (which destroys it: it is stale). The budget evicts the
// least recently prewarmed owner. The harness's runtime keeps 2.
func (s *suite) testPrewarm(t *testing.T) {
	pw, ok := s.rt.(runtime.Prewarmer)
	if !ok {
		t.Skip("the backend does not prewarm")
	}
	ctx := ctxT(t, 3*time.Minute)
	src := s.create(t, runtime.Spec{})
	sh(t, src, "mkdir -p /workspace/proj && echo from-snapshot > /workspace/proj/state")
	var blob bytes.Buffer
	m, err := src.Snapshot(ctx, &blob)
	if err != nil {
		t.Fatal(err)
	}
	layers := func() []runtime.Layer { return []runtime.Layer{{ID: m.ID, R: bytes.NewReader(blob.Bytes())}} }
	spec := func(owner string) runtime.Spec {
		return runtime.Spec{BaseDir: s.base, BaseImage: "busybox-fixture", Owner: owner, Layers: layers()}
	}
	prewarm := func(owner string) {
		t.Helper()
		if _, err := pw.Prewarm(ctx, spec(owner), 1); err != nil {
			t.Fatalf("prewarm for %s: %v", owner, err)
		}
	}
	kept := func(want int, when string) {
		t.Helper()
		if got := pw.PrewarmStats().Kept; got != want {
			t.Fatalf("%s: %d prewarmed, want %d", when, got, want)
		}
	}
	prewarm("acct-a")
	prewarm("acct-a") // the same spec again: nothing more started
	kept(1, "after prewarming acct-a twice")

	// Another owner with the very same layers starts cold.
	b := spec("acct-b")
	b.Env = []string{"WHO=b"}
	if got := sh(t, s.create(t, b), "cat /workspace/proj/state; echo $WHO"); got != "from-snapshot\nb\n" {
		t.Fatalf("acct-b's sandbox: %q", got)
	}
	kept(1, "after acct-b's create")

	// The owner's create takes it, with its own environment.
	a := spec("acct-a")
	a.ID, a.Env = s.id(t), []string{"WHO=a"}
	sa := s.create(t, a)
	kept(0, "after acct-a's create")
	if got := sh(t, sa, "cat /workspace/proj/state; echo $WHO; hostname"); got != "from-snapshot\na\nsandbox\n" {
		t.Fatalf("acct-a's prewarmed sandbox: %q", got)
	}
	if id := sa.ID(); id != a.ID {
		t.Fatalf("the prewarmed sandbox is %q, want %q", id, a.ID)
	}

	// A create of the owner from other layers (none) does not get the
	// stale one, which goes.
	prewarm("acct-a")
	fresh := s.create(t, runtime.Spec{Owner: "acct-a"})
	kept(0, "after a create from other layers")
	if got := sh(t, fresh, "test -e /workspace/proj/state && echo leaked || echo clean"); got != "clean\n" {
		t.Fatalf("a create without layers got the snapshot's files: %q", got)
	}

	// The budget (2) drops the least recently prewarmed owner.
	prewarm("acct-x")
	prewarm("acct-y")
	prewarm("acct-x") // x is used again: y is now the oldest
	prewarm("acct-z")
	kept(2, "after prewarming x, y, z within a budget of 2")
	s.create(t, spec("acct-y"))
	kept(2, "after acct-y's create (evicted: cold)")
	s.create(t, spec("acct-x"))
	kept(1, "after acct-x's create")
	if err := pw.DropPrewarmed(ctx, "acct-z"); err != nil {
		t.Fatal(err)
	}
	kept(0, "after dropping acct-z's")
}
