package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimefake"
	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store"
)

const mib = int64(1) << 20

// saveLimits are sandboxes of 1 GiB of disk and 256 MiB of memory, on a
// node that keeps 64 MiB for itself.
var saveLimits = Settings{Limits: runtime.Limits{DiskBytes: 1024 * mib, MemoryBytes: 256 * mib}, DiskReserveBytes: 64 * mib, MaxTimeout: time.Hour}

// shrinkDisk makes the plane's disk report what set gives it.
func shrinkDisk(p *plane) (set func(free int64), get func() int64) {
	var mu sync.Mutex
	free := int64(1) << 40
	p.m.diskFreeFn = func(string) (int64, error) {
		mu.Lock()
		defer mu.Unlock()
		return free, nil
	}
	set = func(n int64) {
		mu.Lock()
		defer mu.Unlock()
		free = n
	}
	get = func() int64 {
		mu.Lock()
		defer mu.Unlock()
		return free
	}
	return set, get
}

// slowPauser is the fake runtime whose first Pause closes entered and
// waits for release (a checkpoint being written); later ones do not wait.
type slowPauser struct {
	*runtimefake.Runtime
	began   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (r *slowPauser) Pause(ctx context.Context, id string) error {
	if r.began.CompareAndSwap(false, true) {
		close(r.entered)
		<-r.release
	}
	return r.Runtime.Pause(ctx, id)
}

// untouched fails t unless sandbox sb is as it was: running, not in a
// pause, with the same deadline, its runtime sandbox running.
func (p *plane) untouched(t *testing.T, was store.Sandbox) {
	t.Helper()
	cur := p.status(t, was.ID)
	if cur.Status != store.SandboxRunning || cur.Pause != "" || !cur.Deadline.Equal(was.Deadline) {
		t.Errorf("after the refusal %s is %s/%q with deadline %v, want running, not paused, deadline %v", was.ID, cur.Status, cur.Pause, cur.Deadline, was.Deadline)
	}
	rsb, err := p.rt.Get(context.Background(), was.ID)
	if err != nil {
		t.Fatalf("after the refusal: %v", err)
	}
	if st, err := rsb.State(context.Background()); err != nil || st != runtime.StateRunning {
		t.Errorf("after the refusal the runtime has %s %s (%v), want running", was.ID, st, err)
	}
}

// TestPauseAdmitsItsCheckpoint: a pause reserves its checkpoint's bound
// of the node's disk before it writes it, a reservation the other
// admissions see while it is written; once written, the checkpoint is out
// of free space until a resume deletes it. A pause the disk cannot hold is
// refused with ErrQuota (429) and changes nothing.
func TestPauseAdmitsItsCheckpoint(t *testing.T) {
	securitytest.Attack(t, "disk",
		"an account pauses its sandboxes one after another, and two at once, so that their memory checkpoints (which no disk admission counted) fill the node's disk",
		"a pause first reserves its checkpoint's bound (the memory limit) beside the disks promised to the node's sandboxes, a reservation every other admission sees while it is written, and a written checkpoint counts as used; a pause the disk cannot hold is refused with 429 naming the figures, the sandbox running on as it was")
	p := newPlane(t, saveLimits)
	setFree, free := shrinkDisk(p)
	ctx := context.Background()
	var sbs [2]store.Sandbox
	for i := range sbs {
		sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		sbs[i] = p.status(t, sb.ID)
	}
	a, b := sbs[0], sbs[1]
	// 64 MiB kept, 2 GiB promised to the two disks: 300 MiB left, room
	// for one checkpoint of 256 MiB, not two.
	setFree(64*mib + 2048*mib + 300*mib)

	slow := &slowPauser{Runtime: p.rt, entered: make(chan struct{}), release: make(chan struct{})}
	p.m.rt = slow
	release := sync.OnceFunc(func() { close(slow.release) })
	t.Cleanup(release) // a failure below must not leave the pause waiting
	pausedA := make(chan error, 1)
	go func() {
		_, err := p.m.pause(ctx, a)
		pausedA <- err
	}()
	<-slow.entered // a's checkpoint is being written
	_, err := p.m.pause(ctx, b)
	if !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "cannot hold the 256 MiB a pause of sandbox "+b.ID) {
		t.Fatalf("a pause beside one under way: %v, want ErrQuota naming its 256 MiB", err)
	}
	if !strings.Contains(err.Error(), "256 MiB to memory being saved") {
		t.Errorf("the refusal does not name what is being saved: %v", err)
	}
	p.untouched(t, b)
	release()
	if err := <-pausedA; err != nil {
		t.Fatalf("the first pause: %v", err)
	}

	// a's checkpoint is on the disk now (the fake writes none: taken out
	// of free as a real one is).
	setFree(free() - 256*mib)
	if _, err := p.m.pause(ctx, b); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a pause beside a paused sandbox's checkpoint: %v, want ErrQuota", err)
	}
	p.untouched(t, b)
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{}); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a create beside a paused sandbox's checkpoint: %v, want ErrQuota", err)
	}

	// A resume deletes the checkpoint: the room is back.
	if _, err := p.m.resumeSandbox(ctx, p.status(t, a.ID)); err != nil {
		t.Fatal(err)
	}
	setFree(free() + 256*mib)
	if got, err := p.m.pause(ctx, b); err != nil || got.Pause != store.PausePaused {
		t.Fatalf("a pause the disk can hold: %+v %v", got, err)
	}
	if p.m.saving != 0 {
		t.Errorf("%d bytes still reserved after the saves ended", p.m.saving)
	}
}

// TestForkAdmitsItsSavedState: a fork reserves the parent's saved memory
// and the copy of its layer beside its children's disks; a fork the disk
// cannot hold is refused whole with ErrQuota (429), the parent running as
// it was and no child recorded.
func TestForkAdmitsItsSavedState(t *testing.T) {
	securitytest.Attack(t, "disk",
		"an account forks a sandbox when the node's disk has room for the children's disks but not for the parent's memory and layer saved to make them",
		"the fork reserves the parent's saved memory (its bound) and the copy of its layer beside the children's disks: refused whole with 429 naming what is being saved, the parent running as it was and no child recorded")
	p := newPlane(t, saveLimits)
	setFree, free := shrinkDisk(p)
	ctx := context.Background()
	parent, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	rsb, _ := p.rt.Get(ctx, parent.ID)
	if err := rsb.WriteFile(ctx, "/data", strings.NewReader(strings.Repeat("x", int(10*mib))), 0o644); err != nil {
		t.Fatal(err)
	}
	parent = p.status(t, parent.ID)
	// 64 MiB kept, 1014 MiB still promised to the parent's disk, 2 GiB
	// for two children, 200 MiB over: enough for the children's disks,
	// not for them and the 266 MiB the fork saves.
	setFree(64*mib + 1014*mib + 2048*mib + 200*mib)
	_, err = p.m.fork(ctx, parent, 2, 0)
	if !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "266 MiB to memory being saved") {
		t.Fatalf("a fork the disk cannot hold: %v, want ErrQuota naming the 266 MiB being saved", err)
	}
	p.untouched(t, parent)
	if live, _ := p.rt.List(ctx); len(live) != 1 {
		t.Errorf("the runtime has %v after the refusal, want the parent only", live)
	}
	if n, _ := p.st.CountActiveSandboxes(ctx, p.account.ID); n != 1 {
		t.Errorf("%d active sandboxes after the refusal, want the parent only", n)
	}
	if p.m.saving != 0 {
		t.Errorf("%d bytes still reserved after a refused fork", p.m.saving)
	}

	setFree(free() + 100*mib)
	kids, err := p.m.fork(ctx, parent, 2, 0)
	if err != nil || len(kids) != 2 {
		t.Fatalf("a fork the disk can hold: %v %v", kids, err)
	}
	if p.m.saving != 0 {
		t.Errorf("%d bytes still reserved after the fork", p.m.saving)
	}
}
