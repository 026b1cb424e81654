// Package netpol owns sandbox networking on the host: a network namespace
// per sandbox, the veth pair into it, addressing from a pool, NAT for
// egress, the guest's DNS servers, and the nftables rules that enforce the
// sandbox's policy, bandwidth and connection limits.
//
// What it makes for a sandbox whose policy is not "none" (KEY is the first
// 10 hex digits of the SHA-256 of the sandbox id, P is Options.Prefix):
//
//	/run/netns/P-KEY           the namespace; the backend runs the guest in it
//	PKEY <-> eth0              veth pair: host end in the root namespace,
//	                           guest end in the namespace, a /30 of the pool
//	table inet sandboxd_P      one table for all sandboxes (see nft.go):
//	    chains P-KEY-out/-in   the sandbox's policy and limits
//	    chain P-KEY-host       DNS to its resolver, the one way to the host
//	    set P-KEY-dns          addresses its resolver answered, with timeouts
//	    rules in egress/ingress/hostdns jumping to them, tagged with KEY
//	a DNS resolver             on HOSTADDR:53, UDP and TCP, in this process
//	                           (resolver.go, internal/dnsguard)
//	StateDir/KEY.json          the record (id, slot, policy), written first
//
// Invariants:
//   - The deny list always wins over a sandbox's policy: the host itself (all
//     its addresses: nothing from a sandbox may open a connection to the
//     host, which the input hook enforces), the pool (other sandboxes),
//     0.0.0.0/8, loopback, link-local (cloud metadata), multicast and
//     reserved ranges, Options.Deny; and the private ranges (RFC 1918,
//     CGNAT) unless Options.AllowPrivate lets some of them through. The
//     only way through to the host is DNS to the sandbox's own resolver on
//     its gateway address; port 53 anywhere else is dropped. (Networks an
//     older sandboxd made let DNS to the configured resolvers through
//     before the deny list, and keep doing so.)
//   - An allow list's domains hold by DNS: the sandbox's resolver answers
//     only them and puts each answer's addresses in the sandbox's set,
//     which its egress rule accepts after the deny list.
//   - Only IPv4 is routed; IPv6 from a sandbox is dropped.
//   - A record exists before anything it names, and goes last, so
//     Reconcile after a crash finds every leftover: by record, and by name
//     (namespaces, links and chains with the prefix and no record).
//   - Teardown and Reconcile are idempotent.
//
// Nothing here touches the guest's traffic to http://sandboxd.internal: that
// goes through the guest agent's channel home, not the network.
package netpol

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"
	"github.com/sandboxd/sandboxd/internal/dnsguard"
)

// Defaults for Options' zero fields.
const (
	// DefaultRateBytes is each direction's bandwidth per sandbox: 100 Mbit/s.
	DefaultRateBytes = 100_000_000 / 8
	// DefaultBurstBytes is the burst above the rate each direction allows.
	DefaultBurstBytes = 4 << 20
	// DefaultMaxConns is the number of concurrent connections (conntrack
	// entries, TCP and UDP) a sandbox may have open to the outside.
	DefaultMaxConns = 1024
	// DefaultPrefix names the host's objects: links sbx<key>, namespaces
	// sbx-<key>, table sandboxd_sbx.
	DefaultPrefix = "sbx"
)

// DefaultPool is the address pool: a /30 per sandbox, 16,384 sandboxes.
var DefaultPool = netip.MustParsePrefix("10.200.0.0/16")

// Options configure a Manager.
type Options struct {
	// StateDir holds one record per sandbox network. Required.
	StateDir string
	// Prefix (1–4 lowercase letters) starts the names of every link,
	// namespace and chain this Manager makes, and no one else's. Default
	// "sbx". Two Managers on a host must use prefixes neither of which is a
	// prefix of the other.
	Prefix string
	// Pool is where sandbox addresses come from (IPv4, at most /30).
	// Default 10.200.0.0/16. It is denied to sandboxes: one never reaches
	// another.
	Pool netip.Prefix
	// DNS are the resolvers each sandbox's resolver (internal/dnsguard,
	// on the sandbox's gateway address) asks; the guest's resolv.conf
	// names its gateway. Default: the host's IPv4 nameservers from
	// /etc/resolv.conf, a local one (127.0.0.53) included: the resolvers
	// ask from the host, not from a sandbox.
	DNS []netip.Addr
	// Deny adds prefixes to the deny list.
	Deny []netip.Prefix
	// AllowPrivate lets sandboxes reach these parts of the private ranges
	// (e.g. an internal package mirror). The rest of the deny list still
	// wins: pool, loopback, link-local, the host.
	AllowPrivate []netip.Prefix
	// RateBytes and BurstBytes bound each direction's bandwidth per
	// sandbox (bytes/s, bytes; nftables' byte limit lets a full bucket
	// hold a second of the rate on top of the burst); MaxConns bounds its
	// concurrent connections.
	RateBytes  uint64
	BurstBytes uint32
	MaxConns   uint32
	// DNSPort is the port of the DNS servers (default 53): for tests.
	DNSPort uint16
	Logger  *slog.Logger
}

// Manager sets up and tears down sandbox networks on this host. Its methods
// are safe for concurrent use; one Manager per prefix per host.
type Manager struct {
	opts  Options
	log   *slog.Logger
	table string
	slots int // /30s in the pool

	mu    sync.Mutex
	used  map[int]string // slot -> key
	nftMu sync.Mutex     // one nftables transaction at a time
	// recMu orders Update and Teardown: an update's record and rules
	// must neither interleave with another update's nor outlive a
	// teardown (a record written back after it would name nothing).
	recMu sync.Mutex
	// guards are the running resolvers, by key; under recMu.
	guards map[string]*dnsguard.Server
}

// Network is a sandbox's network as set up on the host.
type Network struct {
	ID     string
	Key    string
	Policy Policy
	// Netns is the namespace's path, for the OCI spec's network namespace
	// (runsc --network=sandbox) or for a microVM's tap.
	Netns string
	// HostIf is the host end of the veth pair; the guest end is eth0.
	HostIf    string
	HostAddr  netip.Addr   // the guest's gateway
	GuestAddr netip.Addr   // the guest's address, in a /30 with HostAddr
	DNS       []netip.Addr // nameservers for the guest's resolv.conf
	// Allowed are an allow list's CIDRs and addresses; its domains are
	// enforced by the sandbox's resolver.
	Allowed []netip.Prefix
	// Resolver: the guest's DNS is its resolver on HostAddr, the only
	// DNS it may reach. False only for networks an older sandboxd set
	// up, whose guests use the configured resolvers directly.
	Resolver bool
}

// GuestPrefix is the guest's address with its prefix length (eth0's in
// the namespace): the /30 it shares with HostAddr.
func (n *Network) GuestPrefix() netip.Prefix { return netip.PrefixFrom(n.GuestAddr, 30) }

// Nameservers are n.DNS as strings.
func (n *Network) Nameservers() []string {
	s := make([]string, len(n.DNS))
	for i, a := range n.DNS {
		s[i] = a.String()
	}
	return s
}

// record is the state file of one sandbox network.
type record struct {
	ID      string         `json:"id"`
	Key     string         `json:"key"`
	Slot    int            `json:"slot"`
	Policy  Policy         `json:"policy"`
	Allowed []netip.Prefix `json:"allowed,omitempty"`
	// Resolver: see Network.Resolver.
	Resolver bool      `json:"resolver,omitempty"`
	Created  time.Time `json:"created"`
}

var prefixPattern = regexp.MustCompile(`^[a-z]{1,4}$`)

// New checks opts, prepares the state directory, enables IPv4 forwarding
// and installs (or refreshes) the shared nftables table. Networks an earlier
// process set up are kept: call Reconcile to drop those of sandboxes that
// are gone. It needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN).
func New(ctx context.Context, opts Options) (*Manager, error) {
	if opts.StateDir == "" {
		return nil, errors.New("netpol: StateDir is required")
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if !prefixPattern.MatchString(opts.Prefix) {
		return nil, fmt.Errorf("netpol: prefix %q: want 1-4 lowercase letters", opts.Prefix)
	}
	if !opts.Pool.IsValid() {
		opts.Pool = DefaultPool
	}
	opts.Pool = opts.Pool.Masked()
	if !opts.Pool.Addr().Is4() || opts.Pool.Bits() > 30 || opts.Pool.Bits() < 8 {
		return nil, fmt.Errorf("netpol: pool %s: want an IPv4 prefix between /8 and /30", opts.Pool)
	}
	if opts.RateBytes == 0 {
		opts.RateBytes = DefaultRateBytes
	}
	if opts.BurstBytes == 0 {
		opts.BurstBytes = DefaultBurstBytes
	}
	if opts.MaxConns == 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.DNSPort == 0 {
		opts.DNSPort = 53
	}
	if opts.DNS == nil {
		dns, err := hostNameservers("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("netpol: %w", err)
		}
		opts.DNS = dns
	}
	for _, a := range opts.DNS {
		if !a.Is4() {
			return nil, fmt.Errorf("netpol: DNS server %s: only IPv4 is supported", a)
		}
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("netpol: create state dir: %w", err)
	}
	m := &Manager{
		opts: opts, log: opts.Logger.With("component", "netpol"),
		table: "sandboxd_" + opts.Prefix,
		slots: 1 << (30 - opts.Pool.Bits()),
		used:  map[int]string{}, guards: map[string]*dnsguard.Server{},
	}
	if len(opts.DNS) == 0 {
		m.log.Warn("no DNS servers for sandboxes' resolvers: the host has no IPv4 nameserver; set the DNS option")
	}
	recs, err := m.records()
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		m.used[r.Slot] = r.Key
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("netpol: enable IPv4 forwarding: %w", err)
	}
	if err := m.installTable(); err != nil {
		return nil, fmt.Errorf("netpol: install nftables table %s: %w", m.table, err)
	}
	return m, nil
}

// hostNameservers reads the IPv4 nameservers of a resolv.conf.
func hostNameservers(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return []netip.Addr{}, nil
		}
		return nil, fmt.Errorf("read host resolvers: %w", err)
	}
	defer f.Close()
	dns := []netip.Addr{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil || !a.Is4() {
			continue
		}
		dns = append(dns, a)
	}
	return dns, sc.Err()
}

// Key is the short name of sandbox id's host objects.
func Key(id string) string {
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:5])
}

func (m *Manager) netnsName(key string) string { return m.opts.Prefix + "-" + key }
func (m *Manager) linkName(key string) string  { return m.opts.Prefix + key }

// NetnsPath is where sandbox id's namespace is (or would be) mounted.
func (m *Manager) NetnsPath(id string) string {
	return filepath.Join(netnsDir, m.netnsName(Key(id)))
}

// addrs are the host and guest addresses of slot.
func (m *Manager) addrs(slot int) (host, guest netip.Addr) {
	b := m.opts.Pool.Addr().As4()
	n := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	n += uint32(slot) * 4
	at := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	return at(n + 1), at(n + 2)
}

func (m *Manager) network(r record) *Network {
	host, guest := m.addrs(r.Slot)
	var dns []netip.Addr
	for _, a := range m.opts.DNS {
		if !a.IsLoopback() { // the host's, out of a guest's reach
			dns = append(dns, a)
		}
	}
	if r.Resolver {
		dns = []netip.Addr{host}
	}
	return &Network{
		ID: r.ID, Key: r.Key, Policy: r.Policy,
		Netns:  filepath.Join(netnsDir, m.netnsName(r.Key)),
		HostIf: m.linkName(r.Key), HostAddr: host, GuestAddr: guest,
		DNS: dns, Allowed: r.Allowed, Resolver: r.Resolver,
	}
}

// Setup makes sandbox id's network for policy p and returns it; with
// ModeNone it makes nothing and returns nil. On error nothing is left.
//
// The guest's DNS is a resolver of its own on its gateway address
// (resolver.go), the only DNS it may reach: for an allow list it answers
// only the list's domains and lets the sandbox reach each answer's
// addresses for the answer's TTL; for egress it answers every name.
func (m *Manager) Setup(ctx context.Context, id string, p Policy) (*Network, error) {
	if p.Mode == "" {
		p.Mode = ModeNone
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("set up network of %s: %w", id, err)
	}
	if p.Mode == ModeNone {
		return nil, nil
	}
	allowed, _ := splitAllow(p)
	key := Key(id)
	rec := record{ID: id, Key: key, Policy: p, Allowed: allowed, Resolver: true, Created: time.Now().UTC()}
	var err error
	if rec.Slot, err = m.claim(key); err != nil {
		return nil, fmt.Errorf("set up network of %s: %w", id, err)
	}
	if err := m.writeRecord(rec); err != nil {
		m.release(rec.Slot, key)
		return nil, fmt.Errorf("set up network of %s: %w", id, err)
	}
	n := m.network(rec)
	err = m.build(ctx, n)
	if err == nil {
		m.recMu.Lock()
		err = m.startGuard(n)
		m.recMu.Unlock()
	}
	if err != nil {
		m.recMu.Lock()
		defer m.recMu.Unlock()
		if terr := m.teardown(rec); terr != nil {
			m.log.Warn("clean up failed network", "id", id, "err", terr)
		}
		return nil, fmt.Errorf("set up network of %s: %w", id, err)
	}
	return n, nil
}

func (m *Manager) build(ctx context.Context, n *Network) error {
	if err := makeLinks(n); err != nil {
		return err
	}
	if err := m.addSandboxRules(n); err != nil {
		return fmt.Errorf("nftables rules: %w", err)
	}
	return ctx.Err()
}

// splitAllow splits a validated policy's allow list into prefixes (for
// the firewall) and domain patterns (for the resolver).
func splitAllow(p Policy) ([]netip.Prefix, []string) {
	var pfxs []netip.Prefix
	var names []string
	for _, a := range p.Allow {
		pfx, host, err := parseAllow(a)
		switch {
		case err != nil: // Validate passed: cannot happen
		case host != "":
			names = append(names, host)
		default:
			pfxs = append(pfxs, pfx)
		}
	}
	return pfxs, names
}

// ErrNoResolver is Update's error for domains in a new policy of a
// network an older sandboxd set up: its guest asks the configured
// resolvers, not a resolver of its own, so nothing could enforce them.
// Addresses and CIDRs can still be set; a new sandbox gets a resolver.
var ErrNoResolver = errors.New("the sandbox's network predates per-sandbox DNS: domain rules need a new sandbox (addresses and CIDRs work)")

// ErrNoNetwork is Update's error for a sandbox that was set up without a
// network (policy none): it has no namespace to change the rules of.
var ErrNoNetwork = errors.New("the sandbox has no network of its own")

// Update replaces the policy of sandbox id's network with p, without
// touching its namespace, links or address: the record first, then the
// rules of its chains in one nftables transaction (replaceSandboxRules),
// so open connections the new policy does not allow stop at once and a
// restart rebuilds the new policy. p may be none (nothing in or out); a
// sandbox set up with none has no network to update (ErrNoNetwork). On
// error the old policy stays in force.
func (m *Manager) Update(ctx context.Context, id string, p Policy) (*Network, error) {
	if p.Mode == "" {
		p.Mode = ModeNone
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("update network of %s: %w", id, err)
	}
	allowed, names := splitAllow(p)
	m.recMu.Lock()
	defer m.recMu.Unlock()
	old, err := m.readRecord(Key(id))
	if errors.Is(err, os.ErrNotExist) || (err == nil && old.ID != id) {
		return nil, fmt.Errorf("update network of %s: %w", id, ErrNoNetwork)
	}
	if err != nil {
		return nil, fmt.Errorf("update network of %s: %w", id, err)
	}
	if !old.Resolver && len(names) > 0 {
		return nil, fmt.Errorf("update network of %s: %w", id, ErrNoResolver)
	}
	rec := old
	rec.Policy, rec.Allowed = p, allowed
	if err := m.replaceRecord(rec); err != nil {
		return nil, fmt.Errorf("update network of %s: %w", id, err)
	}
	n := m.network(rec)
	_, oldNames := splitAllow(old.Policy)
	// The addresses answered so far go unless the names and mode stay:
	// they were answers for names the new policy may not allow.
	flush := !slices.Equal(names, oldNames) || old.Policy.Mode != p.Mode
	if err := m.replaceSandboxRules(n, flush); err != nil {
		if werr := m.replaceRecord(old); werr != nil {
			m.log.Error("restore network record after a failed update", "id", id, "err", werr)
		}
		return nil, fmt.Errorf("update network of %s: nftables rules: %w", id, err)
	}
	m.updateGuard(n)
	m.log.Info("network policy updated", "id", id, "from", old.Policy.Mode, "to", p.Mode, "allowed", len(allowed))
	return n, nil
}

// Get returns the network Setup made for sandbox id, also one made by an
// earlier process, or nil when it has none.
func (m *Manager) Get(id string) (*Network, error) {
	rec, err := m.readRecord(Key(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if rec.ID != id {
		return nil, nil
	}
	return m.network(rec), nil
}

// GuestAddr is the address the host reaches sandbox id's network at (for
// the port proxy); ErrNoNetwork when it has none.
func (m *Manager) GuestAddr(id string) (netip.Addr, error) {
	n, err := m.Get(id)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network of %s: %w", id, err)
	}
	if n == nil {
		return netip.Addr{}, fmt.Errorf("sandbox %s: %w", id, ErrNoNetwork)
	}
	return n.GuestAddr, nil
}

// Traffic returns what sandbox id's link carried since its network was set
// up (policy changes do not reset it); nil when it has no network.
func (m *Manager) Traffic(id string) (*Traffic, error) {
	rec, err := m.readRecord(Key(id))
	if errors.Is(err, os.ErrNotExist) || (err == nil && rec.ID != id) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("traffic of %s: %w", id, err)
	}
	tr, err := m.counters(rec.Key)
	if err != nil {
		return nil, fmt.Errorf("traffic of %s: %w", id, err)
	}
	return &tr, nil
}

// Teardown removes sandbox id's network: rules, chains, links, namespace,
// record. It is a no-op for a sandbox without one.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	m.recMu.Lock()
	defer m.recMu.Unlock()
	key := Key(id)
	rec, err := m.readRecord(key)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tear down network of %s: %w", id, err)
	}
	if rec.ID != id {
		return nil
	}
	if err := m.teardown(rec); err != nil {
		return fmt.Errorf("tear down network of %s: %w", id, err)
	}
	return nil
}

// teardown removes everything rec names; the record goes last so a failure
// leaves it for Reconcile.
func (m *Manager) teardown(rec record) error {
	errs := []error{
		m.stopGuard(rec.Key),
		m.delSandboxRules(map[string]bool{rec.Key: true}),
		delLink(m.linkName(rec.Key)),
		delNetns(m.netnsName(rec.Key)),
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(m.recordPath(rec.Key)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	m.release(rec.Slot, rec.Key)
	return nil
}

// Reconcile tears down the networks of sandboxes keep does not know, and
// removes every namespace, link and chain with this Manager's prefix that
// no kept record names: what a crash between steps left behind.
func (m *Manager) Reconcile(ctx context.Context, keep func(id string) bool) error {
	recs, err := m.records()
	if err != nil {
		return fmt.Errorf("reconcile networks: %w", err)
	}
	kept := map[string]bool{}
	var errs []error
	m.recMu.Lock()
	defer m.recMu.Unlock()
	for _, r := range recs {
		if keep(r.ID) {
			kept[r.Key] = true
			// A surviving sandbox of an earlier process gets its
			// resolver back.
			if err := m.startGuard(m.network(r)); err != nil {
				errs = append(errs, fmt.Errorf("restart resolver of %s: %w", r.ID, err))
			}
			continue
		}
		m.log.Info("removing network of a gone sandbox", "id", r.ID, "key", r.Key)
		if err := m.teardown(r); err != nil {
			errs = append(errs, fmt.Errorf("tear down %s: %w", r.ID, err))
			kept[r.Key] = true // its record stays; try again next time
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// Orphans: objects whose record never got written or is gone.
	if err := m.delSandboxRulesExcept(kept); err != nil {
		errs = append(errs, err)
	}
	links, err := listLinks(m.opts.Prefix)
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if key := strings.TrimPrefix(l, m.opts.Prefix); keyPattern.MatchString(key) && !kept[key] {
			m.log.Info("removing leftover link", "link", l)
			errs = append(errs, delLink(l))
		}
	}
	nss, err := listNetns(m.opts.Prefix + "-")
	if err != nil {
		errs = append(errs, err)
	}
	for _, ns := range nss {
		if key := strings.TrimPrefix(ns, m.opts.Prefix+"-"); keyPattern.MatchString(key) && !kept[key] {
			m.log.Info("removing leftover namespace", "netns", ns)
			errs = append(errs, delNetns(ns))
		}
	}
	m.mu.Lock()
	for slot, key := range m.used {
		if !kept[key] {
			delete(m.used, slot)
		}
	}
	m.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reconcile networks: %w", err)
	}
	return nil
}

// claim takes the lowest free slot of the pool for key.
func (m *Manager) claim(key string) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for slot, k := range m.used {
		if k == key {
			return 0, fmt.Errorf("network %s exists (slot %d)", key, slot)
		}
	}
	for slot := 0; slot < m.slots; slot++ {
		if _, ok := m.used[slot]; !ok {
			m.used[slot] = key
			return slot, nil
		}
	}
	return 0, fmt.Errorf("address pool %s is exhausted (%d networks)", m.opts.Pool, m.slots)
}

func (m *Manager) release(slot int, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used[slot] == key {
		delete(m.used, slot)
	}
}

func (m *Manager) recordPath(key string) string {
	return filepath.Join(m.opts.StateDir, key+".json")
}

func (m *Manager) writeRecord(r record) error {
	if _, err := os.Stat(m.recordPath(r.Key)); err == nil {
		return fmt.Errorf("network record %s exists", m.recordPath(r.Key))
	}
	return m.replaceRecord(r)
}

// replaceRecord writes r's record, over the one there may be.
func (m *Manager) replaceRecord(r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := m.recordPath(r.Key)
	// Written aside, synced and renamed: after a crash the record is
	// whole or absent, never a torn file that Reconcile cannot read.
	if err := renameio.WriteFile(p, b, 0o600, renameio.WithTempDir(m.opts.StateDir)); err != nil {
		return fmt.Errorf("write network record: %w", err)
	}
	return nil
}

func (m *Manager) readRecord(key string) (record, error) {
	var r record
	b, err := os.ReadFile(m.recordPath(key))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("parse network record %s: %w", key, err)
	}
	return r, nil
}

var keyPattern = regexp.MustCompile(`^[0-9a-f]{10}$`)

// records reads every record in the state directory; unreadable ones are
// removed (their objects are then orphans for Reconcile).
func (m *Manager) records() ([]record, error) {
	ents, err := os.ReadDir(m.opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("read network records: %w", err)
	}
	var out []record
	for _, e := range ents {
		key, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !keyPattern.MatchString(key) {
			continue
		}
		r, err := m.readRecord(key)
		if err != nil || r.Key != key {
			m.log.Warn("dropping unreadable network record", "file", e.Name(), "err", err)
			_ = os.Remove(filepath.Join(m.opts.StateDir, e.Name()))
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// Uninstall tears down every network of this Manager and deletes its
// nftables table: for removing sandboxd from a host, and for tests.
func (m *Manager) Uninstall(ctx context.Context) error {
	if err := m.Reconcile(ctx, func(string) bool { return false }); err != nil {
		return err
	}
	return m.deleteTable()
}
