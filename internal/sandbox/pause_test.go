package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestPauseResume: a pause stops the deadline clock and refuses nothing
// it should not; exec wakes the sandbox; the timeout of a paused sandbox
// is what it gets at resume; a failed pause leaves it running; stop
// destroys a paused sandbox; reconcile keeps a paused sandbox and settles
// one caught mid-pause.
func TestPauseResume(t *testing.T) {
	p := newPlane(t, Settings{MaxTimeout: time.Hour})
	ctx := context.Background()
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := p.m.pause(ctx, sb)
	if err != nil || paused.Pause != store.PausePaused || paused.Status != store.SandboxRunning {
		t.Fatalf("pause: %+v %v", paused, err)
	}
	if rem := paused.PausedRemaining; rem <= 50*time.Second || rem > time.Minute {
		t.Fatalf("remaining lifetime while paused: %v", rem)
	}
	if again, err := p.m.pause(ctx, paused); err != nil || again.Pause != store.PausePaused {
		t.Fatalf("pause of a paused sandbox: %+v %v", again, err)
	}
	rsb, _ := p.rt.Get(ctx, sb.ID)
	if st, _ := rsb.State(ctx); st != runtime.StatePaused {
		t.Fatalf("runtime state %s", st)
	}
	// The reaper does not see it, however late.
	if exp, err := p.st.ListExpiredSandboxes(ctx, "here", time.Now().Add(time.Hour)); err != nil || len(exp) != 0 {
		t.Fatalf("expired while paused: %v %v", exp, err)
	}
	// Its timeout is what it will have when it resumes.
	if got, err := p.m.setTimeout(ctx, paused, 30*time.Minute); err != nil || got.PausedRemaining != 30*time.Minute || got.Pause != store.PausePaused {
		t.Fatalf("timeout while paused: %+v %v", got, err)
	}
	// Exec wakes it.
	paused = p.status(t, sb.ID)
	if _, err := p.m.exec(ctx, paused, ExecRequest{Command: "true"}, nil, nil); err != nil {
		t.Fatalf("exec on a paused sandbox: %v", err)
	}
	woke := p.status(t, sb.ID)
	if woke.Pause != "" || time.Until(woke.Deadline) < 29*time.Minute || time.Until(woke.Deadline) > 30*time.Minute {
		t.Fatalf("after the exec: pause %q, %v left", woke.Pause, time.Until(woke.Deadline))
	}
	if st, _ := rsb.State(ctx); st != runtime.StateRunning {
		t.Fatalf("runtime state after the exec: %s", st)
	}
	if got, err := p.m.resumeSandbox(ctx, woke); err != nil || got.Pause != "" {
		t.Fatalf("resume of a running sandbox: %+v %v", got, err)
	}

	// A pause the runtime refuses leaves it running, its clock going.
	p.rt.FailPause(errors.New("disk full"))
	if _, err := p.m.pause(ctx, woke); err == nil {
		t.Fatal("a failed pause succeeded")
	}
	p.rt.FailPause(nil)
	if cur := p.status(t, sb.ID); cur.Pause != "" || cur.Status != store.SandboxRunning {
		t.Fatalf("after a failed pause: %+v", cur)
	}

	// Stop destroys a paused sandbox.
	if _, err := p.m.pause(ctx, p.status(t, sb.ID)); err != nil {
		t.Fatal(err)
	}
	if got, err := p.m.stopByRequest(ctx, p.status(t, sb.ID)); err != nil || got.Status != store.SandboxStopped {
		t.Fatalf("stop of a paused sandbox: %+v %v", got, err)
	}
	if _, err := p.m.resumeSandbox(ctx, p.status(t, sb.ID)); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Fatalf("resume of a stopped sandbox: %v", err)
	}

	// Reconcile: a paused sandbox stays paused; one caught pausing while
	// the runtime had paused it becomes paused; one caught resuming whose
	// runtime runs becomes running.
	mk := func() store.Sandbox {
		sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	kept, pausing, resuming := mk(), mk(), mk()
	if _, err := p.m.pause(ctx, kept); err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.st.BeginPause(ctx, pausing.ID, time.Now()); !ok {
		t.Fatal("begin pause")
	}
	if err := p.rt.Pause(ctx, pausing.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.pause(ctx, resuming); err != nil {
		t.Fatal(err)
	}
	if ok, _ := p.st.TransitionPause(ctx, resuming.ID, []string{store.PausePaused}, store.PauseResuming, time.Now()); !ok {
		t.Fatal("to resuming")
	}
	if err := p.rt.Resume(ctx, resuming.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{kept.ID: store.PausePaused, pausing.ID: store.PausePaused, resuming.ID: ""} {
		if cur := p.status(t, id); cur.Status != store.SandboxRunning || cur.Pause != want {
			t.Errorf("after reconcile %s: %s/%q, want running/%q", id, cur.Status, cur.Pause, want)
		}
		if _, err := p.rt.Get(ctx, id); err != nil {
			t.Errorf("reconcile destroyed %s: %v", id, err)
		}
	}
}

// TestPauseAtDeadline: a sandbox created to pause at its timeout is paused
// by the reaper, with the server's default lifetime to run once resumed;
// one that cannot be paused is stopped, as a deadline says.
func TestPauseAtDeadline(t *testing.T) {
	p := newPlane(t, Settings{MaxTimeout: time.Hour, DefaultTimeout: 10 * time.Minute})
	ctx := context.Background()
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{OnTimeout: "hibernate"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("create with an unknown on-timeout: %v, want invalid", err)
	}
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Millisecond, OnTimeout: store.OnTimeoutPause})
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	p.m.reap(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, stopped := p.status(t, sb.ID), p.status(t, other.ID)
		if got.Pause == store.PausePaused && stopped.Status == store.SandboxStopped {
			if got.Status != store.SandboxRunning || got.PausedRemaining < 9*time.Minute || got.PausedRemaining > 10*time.Minute {
				t.Fatalf("paused at its deadline: %+v, want running and paused with the default 10m to run", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the deadline: %+v and %+v, want the first paused and the second stopped", got, stopped)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A pause the runtime refuses: stopped at its deadline after all.
	failing, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Millisecond, OnTimeout: store.OnTimeoutPause})
	if err != nil {
		t.Fatal(err)
	}
	p.rt.FailPause(errors.New("disk full"))
	defer p.rt.FailPause(nil)
	time.Sleep(5 * time.Millisecond)
	p.m.reap(ctx)
	for p.status(t, failing.ID).Status != store.SandboxStopped {
		if time.Now().After(deadline) {
			t.Fatalf("a sandbox that could not be paused at its deadline: %+v, want stopped", p.status(t, failing.ID))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
