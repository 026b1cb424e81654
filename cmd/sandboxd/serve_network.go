package main

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"regexp"

	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// networkOptions are the flags of sandbox networking.
type networkOptions struct {
	policy  netpol.Policy // of sandboxes whose request names none
	pool    netip.Prefix
	prefix  string
	dns     []netip.Addr
	private []netip.Prefix
	rate    uint64
	conns   uint32
}

func (o *networkOptions) register(f *pflag.FlagSet) {
	f.Var(newPolicyValue(&o.policy, netpol.ModeNone), "network-default", `network of sandboxes whose request names none: "none" (loopback only) or "egress" (env SANDBOXD_NETWORK_DEFAULT)`)
	f.Var(newPrefixValue(&o.pool, netpol.DefaultPool), "network-pool", "IPv4 range sandbox addresses come from (a /30 each)")
	f.StringVar(&o.prefix, "network-prefix", netpol.DefaultPrefix, "1-4 lowercase letters starting the names of the host's links, namespaces and nftables table this server makes; two servers on one host need prefixes neither of which starts the other (env SANDBOXD_NETWORK_PREFIX)")
	f.Var(newAddrListValue(&o.dns), "network-dns", "resolvers each sandbox's own resolver asks (default: the host's IPv4 nameservers)")
	f.Var(newPrefixListValue(&o.private), "network-allow-private", "private ranges (CIDRs) sandboxes may reach; the host, other sandboxes and metadata stay denied")
	f.Uint64Var(&o.rate, "network-rate", 100_000_000/8, "bandwidth per sandbox and direction, bytes/s")
	f.Uint32Var(&o.conns, "network-max-conns", 1024, "concurrent connections per sandbox")
}

// networkPrefix is what netpol takes as a prefix.
var networkPrefix = regexp.MustCompile(`^[a-z]{1,4}$`)

// check refuses what netpol.New would: networking that cannot start with
// the default "none" only warns, so a bad value would go unnoticed there.
func (o *networkOptions) check() error {
	if !networkPrefix.MatchString(o.prefix) {
		return flagErrorf("network-prefix", "--network-prefix %q: want 1-4 lowercase letters", o.prefix)
	}
	if p := o.pool.Masked(); !p.Addr().Is4() || p.Bits() > 30 || p.Bits() < 8 {
		return flagErrorf("network-pool", "--network-pool %s: want an IPv4 range between /8 and /30", o.pool)
	}
	return nil
}

// network is sandbox networking: its manager (nil: unavailable, sandboxes
// get loopback only) and the default policy.
type network struct {
	mgr    *netpol.Manager
	policy netpol.Policy
}

// setupNetwork prepares sandbox networking. Networking needs root and
// nftables in the kernel; when it cannot start, sandboxes run with
// loopback only, and a request for a network is refused with a clear
// error, unless --network-default needs it.
func setupNetwork(ctx context.Context, o networkOptions, dataDir string, rt runtime.Runtime, log *slog.Logger) (*network, error) {
	n := &network{policy: o.policy}
	opts := netpol.Options{
		StateDir: filepath.Join(dataDir, "net"), Pool: o.pool, Prefix: o.prefix,
		RateBytes: o.rate, MaxConns: o.conns, Logger: log.With("component", "network"),
	}
	// An empty list is no list: nil DNS means the host's nameservers.
	if len(o.dns) > 0 {
		opts.DNS = o.dns
	}
	if len(o.private) > 0 {
		opts.AllowPrivate = o.private
	}
	if rt.Name() == fakeRuntimeName {
		// Simulated sandboxes have no network to set up; many fake nodes
		// share one host (bench cluster) without touching its nftables.
		return n, nil
	}
	mgr, err := netpol.New(ctx, opts)
	if err != nil {
		if n.policy.Mode != netpol.ModeNone {
			return nil, flagErrorf("network-default", "start sandbox networking (needed by --network-default %s): %w", n.policy.Mode, err)
		}
		log.Warn("sandbox networking unavailable; sandboxes get loopback only", "err", err)
	}
	n.mgr = mgr
	if n.policy.Mode != netpol.ModeNone && !rt.Capabilities().Network {
		return nil, flagErrorf("network-default", "--network-default %s: the %s runtime does not support sandbox networks yet; use --network-default none (or --runtime gvisor)", n.policy.Mode, rt.Name())
	}
	return n, nil
}

// on says whether sandboxes of the default policy get a network.
func (n *network) on() bool { return n.policy.Mode != netpol.ModeNone }
