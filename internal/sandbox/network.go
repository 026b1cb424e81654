package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// NetworkHook gives a sandbox whose policy needs one its network
// namespace (netpol), changes its policy at runtime (UpdateHook), rebuilds
// a kept sandbox's rules from its row after a restart (RecoverHook), and
// removes it when the sandbox ends or is found gone. It owns the sandbox
// networks (NetworkOwner): registering it is what enables them on a
// server.
type NetworkHook struct{ net *netpol.Manager }

// NewNetworkHook returns the network hook over net.
func NewNetworkHook(net *netpol.Manager) *NetworkHook { return &NetworkHook{net: net} }

// Name implements Hook.
func (*NetworkHook) Name() string { return "network" }

// FailureReason implements PrestartHook.
func (*NetworkHook) FailureReason() string { return "could not set up its network" }

// Prestart implements PrestartHook.
func (h *NetworkHook) Prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	policy, err := sandboxPolicy(sb)
	if err != nil || !hasNetwork(policy) {
		return err
	}
	n, err := h.net.Setup(ctx, sb.ID, policy)
	if err != nil {
		return err
	}
	spec.Network = &runtime.Network{Netns: n.Netns, Nameservers: n.Nameservers(), Address: n.GuestPrefix(), Gateway: n.HostAddr}
	return nil
}

// CheckUpdate implements UpdateHook: only a sandbox created with a
// network has one to change (to none and back is allowed).
func (h *NetworkHook) CheckUpdate(_ context.Context, cur, _ store.Sandbox) error {
	n, err := h.net.Get(cur.ID)
	if err != nil {
		return fmt.Errorf("network of %s: %w", cur.ID, err)
	}
	if n == nil {
		return errdefs.New(errdefs.ErrInvalid, `the sandbox was created with network "none" and has no network to change; create a sandbox with a network`)
	}
	return nil
}

// Update implements UpdateHook: the host's rules take the policy on sb's
// row (netpol.Update), or keep the old one and say why not.
func (h *NetworkHook) Update(ctx context.Context, sb store.Sandbox) error {
	p, err := sandboxPolicy(sb)
	if err != nil {
		return err
	}
	_, err = h.net.Update(ctx, sb.ID, p)
	switch {
	case errors.Is(err, netpol.ErrNoNetwork):
		// Torn down meanwhile: the sandbox is ending.
		return errdefs.ErrNotRunning
	case errors.Is(err, netpol.ErrNoResolver):
		return errdefs.Wrap(errdefs.ErrInvalid, err, "network: "+netpol.ErrNoResolver.Error())
	}
	return err
}

// Recover implements RecoverHook: a kept sandbox's rules follow the policy
// on its row, which a crash between an update's two steps can leave apart.
func (h *NetworkHook) Recover(ctx context.Context, sb store.Sandbox) error {
	want, err := sandboxPolicy(sb)
	if err != nil {
		return fmt.Errorf("read sandbox network policy: %w", err)
	}
	n, err := h.net.Get(sb.ID)
	if err != nil || n == nil || policyEqual(n.Policy, want) {
		return nil
	}
	if _, err := h.net.Update(ctx, sb.ID, want); err != nil {
		return fmt.Errorf("rebuild sandbox network policy: %w", err)
	}
	return nil
}

// Stop implements StopHook.
func (h *NetworkHook) Stop(ctx context.Context, id string) error { return h.net.Teardown(ctx, id) }

// Reconcile implements ReconcileHook.
func (h *NetworkHook) Reconcile(ctx context.Context, keep func(id string) bool) error {
	return h.net.Reconcile(ctx, keep)
}

// Traffic implements NetworkOwner.
func (h *NetworkHook) Traffic(id string) (*netpol.Traffic, error) { return h.net.Traffic(id) }

// GuestAddr implements NetworkOwner.
func (h *NetworkHook) GuestAddr(id string) (netip.Addr, error) { return h.net.GuestAddr(id) }

// hasNetwork reports whether a policy needs a network namespace.
func hasNetwork(p netpol.Policy) bool { return p.Mode != "" && p.Mode != netpol.ModeNone }

// sandboxPolicy reads the policy recorded on a sandbox's row.
func sandboxPolicy(sb store.Sandbox) (netpol.Policy, error) {
	var p netpol.Policy
	if sb.Network == "" {
		return netpol.Policy{Mode: netpol.ModeNone}, nil
	}
	err := json.Unmarshal([]byte(sb.Network), &p)
	return p, err
}

func policyEqual(a, b netpol.Policy) bool {
	norm := func(m netpol.Mode) netpol.Mode {
		if m == "" {
			return netpol.ModeNone
		}
		return m
	}
	return norm(a.Mode) == norm(b.Mode) && slices.Equal(a.Allow, b.Allow)
}
