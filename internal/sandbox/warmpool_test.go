package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// waitWarmSize waits for the sizing a create started in the background.
func waitWarmSize(t *testing.T, p *plane, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.rt.WarmSize() != want {
		if time.Now().After(deadline) {
			t.Fatalf("warm pool size %d, want %d", p.rt.WarmSize(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWarmPoolFollowsDemand: the built-in pool grows to the last
// minute's fresh creates, up to its ceiling, and goes back to its floor
// once they are older; creates from a template do not count.
func TestWarmPoolFollowsDemand(t *testing.T) {
	ctx := context.Background()
	p := newPlane(t, Settings{WarmSandboxes: 2, WarmPoolMax: 5})
	now := time.Now()
	p.m.now = func() time.Time { return now }
	for i := range 4 {
		if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			// Sizing runs in the background, one at a time: let each
			// settle before the next is counted.
			waitWarmSize(t, p, 2)
		}
	}
	p.m.sizeWarmPool(ctx)
	waitWarmSize(t, p, 4)
	for range 3 {
		if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	p.m.sizeWarmPool(ctx)
	waitWarmSize(t, p, 5) // the ceiling
	now = now.Add(demandWindow + time.Second)
	p.m.sizeWarmPool(ctx)
	waitWarmSize(t, p, 2) // the floor
}

// TestWarmPoolWithinDisk: the pool grows only as far as the node's disk
// can promise its sandboxes and one create more.
func TestWarmPoolWithinDisk(t *testing.T) {
	ctx := context.Background()
	const gib = int64(1) << 30
	p := newPlane(t, Settings{WarmSandboxes: 1, WarmPoolMax: 10, Limits: runtime.Limits{DiskBytes: gib}})
	p.m.diskFreeFn = func(string) (int64, error) { return 10 * gib, nil }
	create := func(n int) {
		for range n {
			if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
		p.m.sizeWarmPool(ctx)
	}
	// 2 sandboxes and the 1 warm promised 3 GiB: room for the 1 more
	// the demand asks.
	create(2)
	waitWarmSize(t, p, 2)
	// 6 sandboxes and 2 warm promise 8 GiB: room for 2 more, one of
	// them kept for a create, where the demand asks 4 more.
	create(4)
	waitWarmSize(t, p, 3)
}

// TestWarmPoolYieldsToCreates: a create the disk could not promise beside
// the grown pool makes the pool shrink (not below its floor) instead of
// being refused.
func TestWarmPoolYieldsToCreates(t *testing.T) {
	ctx := context.Background()
	const gib = int64(1) << 30
	p := newPlane(t, Settings{WarmSandboxes: 1, WarmPoolMax: 10, Limits: runtime.Limits{DiskBytes: gib}})
	p.m.diskFreeFn = func(string) (int64, error) { return 10 * gib, nil }
	p.m.warm.size = 6 // grown by an earlier burst
	p.rt.SetWarmSize(6)
	// 6 warm leave room for 4 sandboxes; the 5th and 6th take warm ones'.
	for i := range 6 {
		if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); err != nil {
			t.Fatalf("create %d: %v", i+1, err)
		}
	}
	if got := p.rt.WarmSize(); got > 4 {
		t.Fatalf("warm pool size %d after 6 creates on a 10 GiB disk, want at most 4", got)
	}
	// The floor stays: 9 sandboxes and 1 warm fill the disk.
	for range 3 {
		if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute}); err == nil {
		t.Fatal("a create beyond the disk beside the pool's floor was admitted")
	}
}
