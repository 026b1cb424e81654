package runtimetest

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testPool: a pool of a custom template's spec (its layers restored)
// starts its sandboxes ahead, and hands one only to a create of that very
// spec, which gets its own id and environment (the claim's, not the
// pool's); a create of another template, or of the built-in image, starts
// cold. Removing the pool destroys what it kept.
func (s *suite) testPool(t *testing.T) {
	pl, ok := s.rt.(runtime.Pooler)
	if !ok {
		t.Skip("the backend keeps no pools")
	}
	ctx := ctxT(t, 3*time.Minute)
	src := s.create(t, runtime.Spec{})
	sh(t, src, "echo from-the-layer > /opt-layer")
	var blob bytes.Buffer
	m, err := src.Snapshot(ctx, &blob)
	if err != nil {
		t.Fatal(err)
	}
	spec := func(template string) runtime.Spec {
		return runtime.Spec{Template: template, BaseDir: s.base, BaseImage: "busybox-fixture",
			Layers: []runtime.Layer{{ID: m.ID, R: bytes.NewReader(blob.Bytes())}}}
	}
	var opened atomic.Int32
	pl.SetPool("tpl-a", 1, func(context.Context) (runtime.Spec, func(), error) {
		opened.Add(1)
		sp := spec("tpl-a")
		sp.Env = []string{"WHO=pool"} // not the claim's: never seen
		return sp, func() {}, nil
	})
	t.Cleanup(func() { pl.SetPool("tpl-a", 0, nil) })
	ready := func(want int) runtime.PoolStats {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			for _, st := range pl.PoolStats().Pools {
				if st.Name == "tpl-a" && st.Ready == want && st.Starting == 0 {
					return st
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("pool tpl-a: not %d ready: %+v", want, pl.PoolStats())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	ready(1)

	// Another template with the very same files, and the built-in image,
	// start cold.
	b := spec("tpl-b")
	b.Env = []string{"WHO=b"}
	if got := sh(t, s.create(t, b), "cat /opt-layer; echo $WHO"); got != "from-the-layer\nb\n" {
		t.Fatalf("tpl-b's sandbox: %q", got)
	}
	s.create(t, runtime.Spec{})
	if st := ready(1); st.Hits != 0 {
		t.Fatalf("a create of another spec was handed the pool's sandbox: %+v", st)
	}

	// Its own create takes it, with its own id and environment.
	a := spec("tpl-a")
	a.ID, a.Env = s.id(t), []string{"WHO=a"}
	sa := s.create(t, a)
	if sa.ID() != a.ID {
		t.Fatalf("the pooled sandbox answers as %q, not %q", sa.ID(), a.ID)
	}
	if got := sh(t, sa, "cat /opt-layer; echo $WHO"); got != "from-the-layer\na\n" {
		t.Fatalf("the pooled sandbox: %q", got)
	}
	if st := ready(1); st.Hits != 1 || st.Template != "tpl-a" || opened.Load() < 2 {
		t.Fatalf("after the hit: %+v, opened %d", st, opened.Load())
	}
	pl.SetPool("tpl-a", 0, nil)
	for _, st := range pl.PoolStats().Pools {
		if st.Name == "tpl-a" {
			t.Fatalf("a removed pool is listed: %+v", st)
		}
	}
}
