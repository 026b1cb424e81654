package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// fakeNetwork owns sandbox networks for the manager without a host: it
// has a network for the ids in nets, and Update fails with fail.
type fakeNetwork struct {
	nets    map[string]bool
	fail    error
	updated []string // the policies Update applied, as on the row
}

func (*fakeNetwork) Name() string { return "network" }

func (f *fakeNetwork) CheckUpdate(_ context.Context, cur, _ store.Sandbox) error {
	if !f.nets[cur.ID] {
		return errdefs.New(errdefs.ErrInvalid, "no network")
	}
	return nil
}

func (f *fakeNetwork) Update(_ context.Context, sb store.Sandbox) error {
	if f.fail != nil {
		return f.fail
	}
	f.updated = append(f.updated, sb.Network)
	return nil
}

func (f *fakeNetwork) Traffic(id string) (*netpol.Traffic, error) {
	if !f.nets[id] {
		return nil, nil
	}
	return &netpol.Traffic{TxBytes: 1, RxBytes: 2}, nil
}

func (f *fakeNetwork) GuestAddr(id string) (netip.Addr, error) {
	if !f.nets[id] {
		return netip.Addr{}, netpol.ErrNoNetwork
	}
	return netip.MustParseAddr("10.0.0.2"), nil
}

// TestSetNetworkThroughUpdateHooks: a policy change is refused by the
// update hooks' check before the row changes, recorded on the row and
// applied by them, and the row goes back when one fails; the network's
// owner answers Traffic and GuestAddr; without an owner, networking is
// not enabled.
func TestSetNetworkThroughUpdateHooks(t *testing.T) {
	ctx := context.Background()
	fn := &fakeNetwork{nets: map[string]bool{}}
	p := newPlane(t, Settings{}, fn)
	own := auth.Principal{AccountID: p.account.ID}
	sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	egress := netpol.Policy{Mode: netpol.ModeEgress}
	if _, err := p.m.SetNetwork(ctx, own, sb.ID, egress); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("change of a sandbox without a network: %v", err)
	}
	if got := p.status(t, sb.ID); got.Network != sb.Network || len(fn.updated) != 0 {
		t.Fatalf("after a refused check: row %q, updates %q", got.Network, fn.updated)
	}
	fn.nets[sb.ID] = true
	got, err := p.m.SetNetwork(ctx, own, sb.ID, egress)
	if err != nil {
		t.Fatal(err)
	}
	if pol, _ := sandboxPolicy(got); pol.Mode != netpol.ModeEgress || len(fn.updated) != 1 || fn.updated[0] != got.Network {
		t.Fatalf("after the change: row %q, updates %q", got.Network, fn.updated)
	}
	fn.fail = errdefs.ErrNotRunning
	if _, err := p.m.SetNetwork(ctx, own, sb.ID, netpol.Policy{Mode: netpol.ModeNone}); !errors.Is(err, errdefs.ErrNotRunning) {
		t.Fatalf("a failed update: %v", err)
	}
	if now := p.status(t, sb.ID); now.Network != got.Network {
		t.Fatalf("after a failed update the row is %q, want %q back", now.Network, got.Network)
	}
	if tr, err := p.m.Traffic(ctx, own, sb.ID); err != nil || tr == nil || tr.RxBytes != 2 {
		t.Fatalf("traffic: %v, %v", tr, err)
	}
	if addr, err := p.m.GuestAddr(ctx, sb.ID); err != nil || addr.String() != "10.0.0.2" {
		t.Fatalf("guest address: %v, %v", addr, err)
	}

	bare := newPlane(t, Settings{})
	sb, _, err = bare.m.Create(ctx, bare.account.ID, CreateRequest{Lifetime: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.m.SetNetwork(ctx, auth.Principal{AccountID: bare.account.ID}, sb.ID, egress); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a change on a server without networks: %v", err)
	}
	if _, err := bare.m.GuestAddr(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("guest address without networks: %v", err)
	}
}
