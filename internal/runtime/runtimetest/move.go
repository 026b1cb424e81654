package runtimetest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testMove: a paused sandbox saved to a directory (SaveMovable) is
// restored by another runtime on its own state directory — another host —
// as a new sandbox (RestoreMoved): its files and its processes with their
// memory (a counter in a shell, a file in /tmp, which is memory) carry on
// where they were. A runtime that cannot move sandboxes skips it.
func (s *suite) testMove(t *testing.T) {
	mv, ok := s.rt.(runtime.Mover)
	if !ok {
		t.Skip("the runtime does not move paused sandboxes")
	}
	limits := runtime.Limits{DiskBytes: 256 << 20}
	a := s.create(t, runtime.Spec{Limits: limits})
	sh(t, a, "echo kept > /root/moved; echo in-memory > /tmp/m; (i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &")
	time.Sleep(500 * time.Millisecond)
	ctx := ctxT(t, 3*time.Minute)
	if err := mv.Pause(ctx, a.ID()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := mv.SaveMovable(ctx, a.ID(), dir); err != nil {
		t.Fatal(err)
	}
	if err := a.Destroy(ctx); err != nil {
		t.Fatal(err)
	}

	other := s.h.New(t, t.TempDir())
	t.Cleanup(func() { other.Close() })
	b, err := other.(runtime.Mover).RestoreMoved(ctx, runtime.Spec{ID: s.id(t), BaseDir: s.base, BaseImage: "busybox-fixture", Limits: limits}, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background()) })
	got := sh(t, b, "cat /root/moved /tmp/m /tmp/count")
	f := strings.Fields(got)
	if len(f) != 3 || f[0] != "kept" || f[1] != "in-memory" {
		t.Fatalf("after the move: %q", got)
	}
	first, _ := strconv.Atoi(f[2])
	time.Sleep(time.Second)
	later, _ := strconv.Atoi(strings.TrimSpace(sh(t, b, "cat /tmp/count")))
	if first < 2 || later <= first {
		t.Errorf("the counter restored at %d, then %d: want it carried on", first, later)
	}
}
