package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestUsageHistory: the node measures its running sandboxes at each tick
// and keeps their samples, bounded; a paused one is not measured (nor
// woken); a stopped one's history goes; another account sees none.
func TestUsageHistory(t *testing.T) {
	p := newPlane(t, Settings{UsageEvery: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	paused, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	owner := auth.Principal{AccountID: p.account.ID}
	if _, err := p.m.Pause(ctx, owner, paused.ID); err != nil {
		t.Fatal(err)
	}
	go p.m.measureUsage(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := p.m.UsageHistory(ctx, owner, running.ID, time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) >= 3 {
			if !got[0].At.Before(got[2].At) {
				t.Fatalf("samples out of order: %+v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d samples after 10s", len(got))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got, _ := p.m.UsageHistory(ctx, owner, paused.ID, time.Time{}, time.Time{}); len(got) != 0 {
		t.Fatalf("a paused sandbox was measured: %+v", got)
	}
	if sb, _ := p.st.GetSandbox(ctx, paused.ID); sb.Pause != store.PausePaused {
		t.Fatalf("the measures woke the paused sandbox: %q", sb.Pause)
	}
	mallory := store.Account{Name: "mallory", Kind: store.AccountPersonal}
	if err := p.st.CreateAccount(ctx, &mallory); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.UsageHistory(ctx, auth.Principal{AccountID: mallory.ID}, running.ID, time.Time{}, time.Time{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another account's history: %v", err)
	}
	if _, err := p.m.Stop(ctx, owner, running.ID); err != nil {
		t.Fatal(err)
	}
	for time.Now().Before(deadline) {
		p.m.usage.mu.Lock()
		_, kept := p.m.usage.samples[running.ID]
		p.m.usage.mu.Unlock()
		if !kept {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := p.m.usage.between(running.ID, time.Time{}, time.Time{}); len(got) != 0 {
		t.Fatalf("a stopped sandbox's history stays: %d samples", len(got))
	}

	// Bounded.
	var h usageHistory
	for i := range maxUsageSamples + 10 {
		h.add("x", UsageSample{At: time.Unix(int64(i), 0)})
	}
	if got := h.between("x", time.Time{}, time.Time{}); len(got) != maxUsageSamples || got[0].At.Unix() != 10 {
		t.Fatalf("bounded: %d samples from %v", len(got), got[0].At)
	}
}
