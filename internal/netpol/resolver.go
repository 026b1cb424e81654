package netpol

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/sandboxd/sandboxd/internal/dnsguard"
)

// A sandbox's resolver (internal/dnsguard) listens on its gateway address,
// UDP and TCP port 53, from Setup to Teardown, and again after a restart
// for the sandboxes Reconcile keeps. Its answers for an allow list's
// domains go into the sandbox's address set (nft.go) for their TTL, so a
// name keeps working when its addresses change, and a name not on the list
// never resolves, whatever addresses it shares with one that is. In egress
// mode it answers every name and records nothing: the firewall lets the
// sandbox reach any address the deny list does not hold anyway. The deny
// list still wins: the set is matched after it.

// rulesOf is what n's resolver answers.
func rulesOf(n *Network) dnsguard.Rules {
	if n.Policy.Mode == ModeEgress {
		return dnsguard.Rules{Any: true}
	}
	_, names := splitAllow(n.Policy)
	return dnsguard.Rules{Names: names}
}

// startGuard starts n's resolver unless it runs or n has none (policy
// none, or a network of an older sandboxd). The caller holds recMu.
func (m *Manager) startGuard(n *Network) error {
	if !n.Resolver || n.Policy.Mode == ModeNone || m.guards[n.Key] != nil {
		return nil
	}
	up := make([]netip.AddrPort, len(m.opts.DNS))
	for i, a := range m.opts.DNS {
		up[i] = netip.AddrPortFrom(a, m.opts.DNSPort)
	}
	key := n.Key
	g, err := dnsguard.Start(dnsguard.Options{
		Addr: n.HostAddr, Port: m.opts.DNSPort, Upstream: up,
		Record: func(addrs []netip.Addr, timeout time.Duration) error {
			return m.allowAddrs(key, addrs, timeout)
		},
		Logger: m.log.With("id", n.ID),
	}, rulesOf(n))
	if err != nil {
		return fmt.Errorf("start resolver: %w", err)
	}
	m.guards[key] = g
	return nil
}

// updateGuard gives n's resolver n's (new) policy; a policy of none stops
// it. The caller holds recMu.
func (m *Manager) updateGuard(n *Network) {
	if n.Policy.Mode == ModeNone {
		if err := m.stopGuard(n.Key); err != nil {
			m.log.Warn("stop resolver", "id", n.ID, "err", err)
		}
		return
	}
	if g := m.guards[n.Key]; g != nil {
		g.SetRules(rulesOf(n))
		return
	}
	if err := m.startGuard(n); err != nil {
		m.log.Warn("start resolver", "id", n.ID, "err", err)
	}
}

// stopGuard stops key's resolver, if it runs. The caller holds recMu.
func (m *Manager) stopGuard(key string) error {
	g := m.guards[key]
	if g == nil {
		return nil
	}
	delete(m.guards, key)
	if err := g.Close(); err != nil {
		return fmt.Errorf("stop resolver: %w", err)
	}
	return nil
}
