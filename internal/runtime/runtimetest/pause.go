package runtimetest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testPauseResume: a paused sandbox keeps its memory and processes (a
// process counting in memory continues from where it was, not from zero,
// and does not count while paused), its files, and its place in List; it
// refuses calls while paused; it survives a restart of the runtime paused,
// resumes after it, and Destroy removes a paused sandbox whole.
func (s *suite) testPauseResume(t *testing.T) {
	p, ok := s.rt.(runtime.Pauser)
	if !ok {
		t.Skip("the backend does not pause")
	}
	ctx := ctxT(t, 4*time.Minute)
	sb := s.create(t, runtime.Spec{})
	id := sb.ID()
	// The count lives in the shell's memory; the file only shows it.
	sh(t, sb, "echo kept > /workspace/f\n"+countInMemory+"\nsleep 1")
	before := count(t, sb)
	if err := p.Resume(ctx, id); err == nil {
		t.Error("resume of a running sandbox succeeded")
	}
	start := time.Now()
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("pause: %v", err)
	}
	// The sandbox runs on while Pause readies it (the first may wait for
	// a trial of what the backend can save): up to 10 counts a second of
	// it are its own.
	readying := int(time.Since(start) / (100 * time.Millisecond))
	if st, err := sb.State(ctx); err != nil || st != runtime.StatePaused {
		t.Fatalf("state while paused: %v %v", st, err)
	}
	if _, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, runtime.ErrNotRunning) {
		t.Errorf("exec while paused: %v, want ErrNotRunning", err)
	}
	if err := p.Pause(ctx, id); err == nil {
		t.Error("pause of a paused sandbox succeeded")
	}

	// A restart of the runtime finds it paused.
	if err := s.rt.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	s.rt = s.h.New(t, s.state) // the suite's other users get the new one
	p = s.rt.(runtime.Pauser)
	again, err := s.rt.Get(ctx, id)
	if err != nil {
		t.Fatalf("get a paused sandbox after a restart: %v", err)
	}
	if st, err := again.State(ctx); err != nil || st != runtime.StatePaused {
		t.Fatalf("state after a restart: %v %v", st, err)
	}
	if err := p.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if st, err := again.State(ctx); err != nil || st != runtime.StateRunning {
		t.Fatalf("state after resume: %v %v", st, err)
	}
	after := count(t, again)
	if after < before || after > before+5+readying {
		t.Fatalf("the counter was %d before the pause and %d after it: it did not continue where it was", before, after)
	}
	time.Sleep(time.Second)
	if later := count(t, again); later <= after {
		t.Fatalf("the counter stopped after resume: %d then %d", after, later)
	}
	if got := sh(t, again, "cat /workspace/f"); got != "kept\n" {
		t.Fatalf("file after resume: %q", got)
	}

	// Paused again, then destroyed whole.
	if err := p.Pause(ctx, id); err != nil {
		t.Fatalf("pause again: %v", err)
	}
	var leaks func() []string
	if s.h.Leaks != nil {
		leaks = s.h.Leaks(t, s.state, again)
	}
	if err := again.Destroy(context.Background()); err != nil {
		t.Fatalf("destroy a paused sandbox: %v", err)
	}
	if leaks != nil {
		if l := leaks(); len(l) > 0 {
			t.Errorf("a destroyed paused sandbox left %v", l)
		}
	}
	if _, err := s.rt.Get(ctx, id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("get after destroy: %v", err)
	}
}

// countInMemory starts a shell that counts in its own memory ten
// times a second and writes the count to /tmp/count: a process whose
// state is in memory only, for tests of memory snapshots. The file is
// replaced by a rename, so that a reader never finds it empty.
const countInMemory = `(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &`

// count reads the count countInMemory writes in sb.
func count(t *testing.T, sb runtime.Sandbox) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(sh(t, sb, "cat /tmp/count")))
	if err != nil {
		t.Fatalf("count in %s: %v", sb.ID(), err)
	}
	return n
}
