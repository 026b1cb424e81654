package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testFork: each child of a fork starts from the parent's memory and files
// at one moment (a shell counting in memory counts on in every child from
// where the parent was, and the file it writes agrees with the memory),
// with its own environment for new processes; parent and children then go
// their own ways (files written in one are not in the others), the parent
// runs on, and destroying a child leaves the others and the parent alone.
// A destroyed child leaves nothing behind. A child spec whose network does
// not match the parent's is refused.
func (s *suite) testFork(t *testing.T) {
	f, ok := s.rt.(runtime.Forker)
	if !ok {
		t.Skip("the backend does not fork")
	}
	ctx := ctxT(t, 4*time.Minute)
	parent := s.create(t, runtime.Spec{Env: []string{"WHO=parent"}})
	sh(t, parent, "echo from-parent > /workspace/f\n"+countInMemory+"\nsleep 1")
	before := count(t, parent)

	if _, err := f.Fork(ctx, parent.ID(), []runtime.Spec{{ID: s.id(t), Network: &runtime.Network{Netns: "/nonexistent"}}}); err == nil {
		t.Fatal("a child with a network of a parent without one was made")
	}
	if _, err := f.Fork(ctx, "no-such-sandbox", []runtime.Spec{{ID: s.id(t)}}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("fork of a missing sandbox: %v, want ErrNotFound", err)
	}

	const n = 2
	specs := make([]runtime.Spec, n)
	for i := range specs {
		specs[i] = runtime.Spec{ID: s.id(t), Env: []string{fmt.Sprintf("WHO=child%d", i)}}
	}
	start := time.Now()
	kids, err := f.Fork(ctx, parent.ID(), specs)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("fork of %d: %v", n, time.Since(start).Round(time.Millisecond))
	if len(kids) != n {
		t.Fatalf("fork made %d sandboxes, want %d", len(kids), n)
	}
	for _, k := range kids {
		t.Cleanup(func() { _ = k.Destroy(context.Background()) })
	}
	for i, k := range kids {
		if k.ID() != specs[i].ID {
			t.Errorf("child %d is %q, want %q", i, k.ID(), specs[i].ID)
		}
		if got := sh(t, k, `cat /workspace/f; echo "$WHO"`); got != fmt.Sprintf("from-parent\nchild%d\n", i) {
			t.Errorf("child %d: file and env %q", i, got)
		}
		// The counter goes on from the parent's, not from zero.
		c := count(t, k)
		if c < before {
			t.Errorf("child %d counts %d, the parent had %d before the fork: it did not start from the parent's memory", i, c, before)
		}
		time.Sleep(300 * time.Millisecond)
		if later := count(t, k); later <= c {
			t.Errorf("child %d's counter stopped: %d then %d", i, c, later)
		}
		sh(t, k, fmt.Sprintf("echo child%d > /workspace/own", i))
	}
	if got := sh(t, parent, `echo "$WHO"; ls /workspace`); got != "parent\nf\n" {
		t.Errorf("parent after the fork: %q (a child's file reached it?)", got)
	}
	if c := count(t, parent); c < before {
		t.Errorf("parent's counter went back: %d, had %d", c, before)
	}
	if got := sh(t, kids[1], "cat /workspace/own"); got != "child1\n" {
		t.Errorf("child 1's own file: %q", got)
	}
	var leaks func() []string
	if s.h.Leaks != nil {
		leaks = s.h.Leaks(t, s.state, kids[0])
	}
	if err := kids[0].Destroy(ctx); err != nil {
		t.Fatalf("destroy child 0: %v", err)
	}
	if leaks != nil {
		if l := leaks(); len(l) > 0 {
			t.Errorf("a destroyed child left %v", l)
		}
	}
	for _, sb := range []runtime.Sandbox{parent, kids[1]} {
		if st, err := sb.State(ctx); err != nil || st != runtime.StateRunning {
			t.Errorf("%s after a child was destroyed: %v %v", sb.ID(), st, err)
		}
	}
	// A fork of a fork.
	grand, err := f.Fork(ctx, kids[1].ID(), []runtime.Spec{{ID: s.id(t)}})
	if err != nil {
		t.Fatalf("fork of a child: %v", err)
	}
	t.Cleanup(func() { _ = grand[0].Destroy(context.Background()) })
	if got := sh(t, grand[0], "cat /workspace/own"); got != "child1\n" {
		t.Errorf("grandchild's file: %q", got)
	}
}
