package netpol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/sandboxd/sandboxd/internal/dnsguard"
	"golang.org/x/sys/unix"
)

// The table (family inet, named sandboxd_<prefix>; P is the prefix):
//
//	chain forward  hook forward, policy accept   (rebuilt by New)
//	    iifname "P*" jump egress
//	    oifname "P*" jump ingress
//	    iifname "P*" drop                         unknown sandbox link
//	    oifname "P*" drop
//	chain input    hook input, policy accept     (rebuilt by New)
//	    iifname "P*" ct state established,related accept
//	    iifname "P*" jump hostdns
//	    iifname "P*" drop                         sandboxes never reach the host
//	chain hostdns                                (kept across restarts)
//	    iifname "PKEY" goto P-KEY-host           one per sandbox, comment KEY
//	chain P-KEY-host                             (rebuilt with the policy)
//	    ip saddr GUEST ip daddr GATEWAY udp/tcp dport 53 accept   its resolver
//	    drop                                     (only this for none)
//	set P-KEY-dns  ipv4_addr, flags timeout,dynamic: what the resolver
//	                                             answered for allowed names
//	chain postrouting  nat hook                  (rebuilt by New)
//	    meta nfproto ipv4 ip saddr POOL oifname != "P*" masquerade
//	chain egress / ingress                       (kept across restarts)
//	    iifname "PKEY" goto P-KEY-out            one per sandbox, comment KEY
//	    oifname "PKEY" goto P-KEY-in
//	chain dns      ip daddr RESOLVER udp/tcp dport 53 accept   (rebuilt)
//	chain deny     ip daddr DENIED drop                         (rebuilt)
//	chain private  ip daddr ALLOWED-PRIVATE return; ip daddr PRIVATE drop (rebuilt)
//	chain P-KEY-out                               (every packet, not only new
//	                                              ones: see policyRules)
//	    meta nfproto ipv6 drop
//	    ip saddr != GUEST drop                    spoofed sources (guest root
//	                                              can add any address to eth0)
//	    limit rate over RATE bytes/second burst BURST bytes drop
//	    ct state new ct count over MAXCONNS drop
//	    udp/tcp dport 53 drop                     DNS only to its resolver
//	                                              (older networks: jump dns)
//	    jump deny; jump private
//	    accept                                    egress
//	    ip daddr ALLOWED accept ...               allow list's CIDRs
//	    ip daddr @P-KEY-dns update @P-KEY-dns { ip daddr timeout 1h } accept
//	                                              its answered domains
//	    drop                                      (only this for none)
//	chain P-KEY-in
//	    meta nfproto ipv6 drop
//	    limit rate over RATE bytes/second burst BURST bytes drop
//	    ct state established,related accept       egress
//	    ip saddr ALLOWED|@P-KEY-dns ct state established,related accept   allow list
//	    drop                                      nothing dials into a sandbox
//	                                              through the forward path
//
// Rules match addresses one prefix per rule: the lists are short, and rules
// avoid the quirks of interval sets. The host's own addresses need no list:
// a packet to any of them takes the input hook, where sandboxes may only
// answer.

// hardDeny is denied to every sandbox, whatever the operator allows.
var hardDeny = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"), // link-local: cloud metadata
	netip.MustParsePrefix("224.0.0.0/4"),    // multicast
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, broadcast
}

// privateRanges are denied unless Options.AllowPrivate says otherwise.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT, also some clouds' internal networks
	netip.MustParsePrefix("198.18.0.0/15"), // benchmarking, used by some proxies
}

// Chain names.
const (
	chainForward     = "forward"
	chainInput       = "input"
	chainPostrouting = "postrouting"
	chainEgress      = "egress"
	chainIngress     = "ingress"
	chainDNS         = "dns"
	chainDeny        = "deny"
	chainPrivate     = "private"
	chainHostDNS     = "hostdns"
)

func (m *Manager) tbl() *nftables.Table {
	return &nftables.Table{Name: m.table, Family: nftables.TableFamilyINet}
}

func (m *Manager) outChain(key string) string { return m.opts.Prefix + "-" + key + "-out" }
func (m *Manager) inChain(key string) string  { return m.opts.Prefix + "-" + key + "-in" }

// hostChain is the input-hook chain of a sandbox's packets to the host:
// only DNS to its resolver on its gateway address (resolver.go).
func (m *Manager) hostChain(key string) string { return m.opts.Prefix + "-" + key + "-host" }

// addrSet names the set of addresses the sandbox's resolver answered for
// allowed names, each with its timeout.
func (m *Manager) addrSet(key string) string { return m.opts.Prefix + "-" + key + "-dns" }

func (m *Manager) addrSetOf(key string) *nftables.Set {
	// Dynamic: the egress rule renews an element's timeout (dynset
	// update) from the packet path.
	return &nftables.Set{Table: m.tbl(), Name: m.addrSet(key), KeyType: nftables.TypeIPAddr, HasTimeout: true, Dynamic: true}
}

// Counter objects of a sandbox: named, so they keep counting when Update
// replaces the chains' rules.
func (m *Manager) txCounter(key string) string { return m.opts.Prefix + "-" + key + "-tx" }
func (m *Manager) rxCounter(key string) string { return m.opts.Prefix + "-" + key + "-rx" }

// installTable creates the table and its shared chains, and rebuilds the
// rules that depend on Options; per-sandbox chains and their jumps stay.
func (m *Manager) installTable() error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := c.AddTable(m.tbl())
	accept := nftables.ChainPolicyAccept
	base := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
		c.FlushChain(ch)
		return ch
	}
	regular := func(name string, flush bool) *nftables.Chain {
		ch := c.AddChain(&nftables.Chain{Name: name, Table: t})
		if flush {
			c.FlushChain(ch)
		}
		return ch
	}
	// Regular chains first: base chains jump to them.
	egress, ingress := regular(chainEgress, false), regular(chainIngress, false)
	hostDNS := regular(chainHostDNS, false)
	dns, deny, private := regular(chainDNS, true), regular(chainDeny, true), regular(chainPrivate, true)
	fwd := base(chainForward, nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	in := base(chainInput, nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	post := base(chainPostrouting, nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)

	p := m.opts.Prefix
	add := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(exprs...)})
	}
	add(fwd, ifname(expr.MetaKeyIIFNAME, p, false), jump(expr.VerdictJump, egress.Name))
	add(fwd, ifname(expr.MetaKeyOIFNAME, p, false), jump(expr.VerdictJump, ingress.Name))
	add(fwd, ifname(expr.MetaKeyIIFNAME, p, false), verdict(expr.VerdictDrop))
	add(fwd, ifname(expr.MetaKeyOIFNAME, p, false), verdict(expr.VerdictDrop))
	add(in, ifname(expr.MetaKeyIIFNAME, p, false), ctEstablished(), verdict(expr.VerdictAccept))
	add(in, ifname(expr.MetaKeyIIFNAME, p, false), jump(expr.VerdictJump, hostDNS.Name))
	add(in, ifname(expr.MetaKeyIIFNAME, p, false), verdict(expr.VerdictDrop))
	add(post, nfproto(unix.NFPROTO_IPV4), ipAddr(12, m.opts.Pool), ifnameNeq(expr.MetaKeyOIFNAME, p), []expr.Any{&expr.Masq{}})
	// For networks an older sandboxd made, whose guests ask the resolvers
	// themselves: never a loopback one, which is the host's.
	for _, a := range m.opts.DNS {
		if a.IsLoopback() {
			continue
		}
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(dns, ipAddr(16, netip.PrefixFrom(a, 32)), l4dport(proto, 53), verdict(expr.VerdictAccept))
		}
	}
	for _, pfx := range append(append(append([]netip.Prefix{}, hardDeny...), m.opts.Pool), m.opts.Deny...) {
		add(deny, ipAddr(16, pfx), verdict(expr.VerdictDrop))
	}
	for _, pfx := range m.opts.AllowPrivate {
		add(private, ipAddr(16, pfx), verdict(expr.VerdictReturn))
	}
	for _, pfx := range privateRanges {
		add(private, ipAddr(16, pfx), verdict(expr.VerdictDrop))
	}
	return c.Flush()
}

// addSandboxRules adds n's chains and the jumps to them, in one
// transaction.
func (m *Manager) addSandboxRules(n *Network) error { return m.sandboxRules(n, false, false) }

// replaceSandboxRules swaps the rules of n's chains for those of its
// (new) policy in one transaction: no packet sees half of either. With
// flushAddrs the addresses its resolver answered go too: they were
// answers for names the new policy may not allow.
func (m *Manager) replaceSandboxRules(n *Network, flushAddrs bool) error {
	return m.sandboxRules(n, true, flushAddrs)
}

func (m *Manager) sandboxRules(n *Network, replace, flushAddrs bool) error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := m.tbl()
	out := &nftables.Chain{Name: m.outChain(n.Key), Table: t}
	in := &nftables.Chain{Name: m.inChain(n.Key), Table: t}
	host := &nftables.Chain{Name: m.hostChain(n.Key), Table: t}
	// Adding a set or chain that exists keeps it (and the set's
	// elements): a network made before them gets them on its first
	// update.
	set := m.addrSetOf(n.Key)
	if err := c.AddSet(set, nil); err != nil {
		return fmt.Errorf("add set %s: %w", set.Name, err)
	}
	host = c.AddChain(host)
	// Adding a counter that exists keeps its count (a network made before
	// counters existed gets them on its first update).
	c.AddObj(&nftables.CounterObj{Table: t, Name: m.txCounter(n.Key)})
	c.AddObj(&nftables.CounterObj{Table: t, Name: m.rxCounter(n.Key)})
	tag := userdata.AppendString(nil, userdata.TypeComment, n.Key)
	if replace {
		c.FlushChain(out)
		c.FlushChain(in)
		c.FlushChain(host)
		if flushAddrs {
			c.FlushSet(set)
		}
		m.policyRules(c, out, in, host, set, n)
		return c.Flush()
	}
	out, in = c.AddChain(out), c.AddChain(in)
	m.policyRules(c, out, in, host, set, n)
	m.hostJump(c, n, tag)
	c.InsertRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: chainEgress, Table: t}, UserData: tag,
		Exprs: concat(ifname(expr.MetaKeyIIFNAME, n.HostIf, true), jump(expr.VerdictGoto, out.Name))})
	c.InsertRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: chainIngress, Table: t}, UserData: tag,
		Exprs: concat(ifname(expr.MetaKeyOIFNAME, n.HostIf, true), jump(expr.VerdictGoto, in.Name))})
	return c.Flush()
}

// hostJump sends n's packets to the host through its host chain.
func (m *Manager) hostJump(c *nftables.Conn, n *Network, tag []byte) {
	t := m.tbl()
	c.InsertRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: chainHostDNS, Table: t}, UserData: tag,
		Exprs: concat(ifname(expr.MetaKeyIIFNAME, n.HostIf, true), jump(expr.VerdictGoto, m.hostChain(n.Key)))})
}

// Traffic is what a sandbox's link carried, as IP packets (headers
// included), counted before any verdict of its policy.
type Traffic struct {
	TxBytes, TxPackets uint64 // from the sandbox
	RxBytes, RxPackets uint64 // to the sandbox
}

// Add adds o's counts to t's.
func (t *Traffic) Add(o Traffic) {
	t.TxBytes += o.TxBytes
	t.TxPackets += o.TxPackets
	t.RxBytes += o.RxBytes
	t.RxPackets += o.RxPackets
}

// counters reads the counters of key.
func (m *Manager) counters(key string) (Traffic, error) {
	c, err := nftables.New()
	if err != nil {
		return Traffic{}, err
	}
	var tr Traffic
	for _, side := range []struct {
		name           string
		bytes, packets *uint64
	}{{m.txCounter(key), &tr.TxBytes, &tr.TxPackets}, {m.rxCounter(key), &tr.RxBytes, &tr.RxPackets}} {
		o, err := c.GetObject(&nftables.CounterObj{Table: m.tbl(), Name: side.name})
		if err != nil {
			return Traffic{}, fmt.Errorf("read counter %s: %w", side.name, err)
		}
		co, ok := o.(*nftables.CounterObj)
		if !ok {
			return Traffic{}, fmt.Errorf("read counter %s: not a counter", side.name)
		}
		*side.bytes, *side.packets = co.Bytes, co.Packets
	}
	return tr, nil
}

// policyRules adds the rules of n's empty chains out and in. The policy is
// checked on every packet, not only on a connection's first: a policy
// replaced at runtime (Update) then also holds for connections it no
// longer allows, in both directions.
func (m *Manager) policyRules(c *nftables.Conn, out, in, host *nftables.Chain, set *nftables.Set, n *Network) {
	t := m.tbl()
	add := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: concat(exprs...)})
	}
	for _, ch := range []*nftables.Chain{out, in} {
		// Every byte the sandbox sends or is sent, as IP packets, before
		// any verdict: what its link carried, the policy's drops included.
		counter := m.rxCounter(n.Key)
		if ch == out {
			counter = m.txCounter(n.Key)
		}
		add(ch, []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counter}})
		add(ch, nfproto(unix.NFPROTO_IPV6), verdict(expr.VerdictDrop))
		if ch == out {
			// Before anything can accept: only the sandbox's own address
			// leaves. Otherwise guest root could send as another sandbox
			// (masquerading would then deliver the replies to it) or as
			// any address of the internet.
			if n.GuestAddr.Is4() {
				add(ch, ipAddrNeq(12, netip.PrefixFrom(n.GuestAddr, 32)), verdict(expr.VerdictDrop))
			} else {
				add(ch, verdict(expr.VerdictDrop)) // no address of its own: nothing leaves
			}
		}
		add(ch, []expr.Any{&expr.Limit{Type: expr.LimitTypePktBytes, Rate: m.opts.RateBytes, Unit: expr.LimitTimeSecond, Burst: m.opts.BurstBytes, Over: true}}, verdict(expr.VerdictDrop))
	}
	// Packets to the host: DNS to the sandbox's resolver on its gateway
	// address, from its own address, and nothing else (the input chain
	// drops what this chain returns).
	if n.Resolver && n.Policy.Mode != ModeNone && n.GuestAddr.Is4() {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(host, ipAddr(12, netip.PrefixFrom(n.GuestAddr, 32)), ipAddr(16, netip.PrefixFrom(n.HostAddr, 32)),
				l4dport(proto, 53), verdict(expr.VerdictAccept))
		}
	}
	add(host, verdict(expr.VerdictDrop))
	if n.Policy.Mode == ModeNone {
		// A policy changed to none: nothing in or out, DNS included.
		add(out, verdict(expr.VerdictDrop))
		add(in, verdict(expr.VerdictDrop))
		return
	}
	add(out, ctStateIs(expr.CtStateBitNEW), []expr.Any{&expr.Connlimit{Count: m.opts.MaxConns, Flags: expr.NFT_CONNLIMIT_F_INV}}, verdict(expr.VerdictDrop))
	if n.Resolver {
		// Its resolver is the only DNS a sandbox gets: a name the policy
		// does not allow must not resolve through another one.
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			add(out, l4dport(proto, 53), verdict(expr.VerdictDrop))
		}
	} else {
		// A network made before resolvers: its guest was given the
		// configured resolvers.
		add(out, jump(expr.VerdictJump, chainDNS))
	}
	add(out, jump(expr.VerdictJump, chainDeny))
	add(out, jump(expr.VerdictJump, chainPrivate))
	switch n.Policy.Mode {
	case ModeEgress:
		add(out, verdict(expr.VerdictAccept))
		add(in, ctEstablished(), verdict(expr.VerdictAccept))
	case ModeAllow:
		for _, pfx := range n.Allowed {
			add(out, ipAddr(16, pfx), verdict(expr.VerdictAccept))
		}
		// An answered address stays allowed for the answer's TTL
		// (dnsguard.MinTTL to MaxTTL), and while the sandbox uses it:
		// every packet to it renews it for MaxTTL, so a connection
		// outliving the answer is not cut. Only addresses in the set are
		// renewed (the lookup comes first): the packet path never adds.
		add(out, inSet(16, set), []expr.Any{&expr.Dynset{SrcRegKey: 1, SetName: set.Name, SetID: set.ID,
			Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: dnsguard.MaxTTL}}, verdict(expr.VerdictAccept))
		// Replies only from what the policy lets the sandbox reach now:
		// its resolvers and its allow list.
		if !n.Resolver {
			for _, a := range m.opts.DNS {
				add(in, ipAddr(12, netip.PrefixFrom(a, 32)), ctEstablished(), verdict(expr.VerdictAccept))
			}
		}
		for _, pfx := range n.Allowed {
			add(in, ipAddr(12, pfx), ctEstablished(), verdict(expr.VerdictAccept))
		}
		add(in, inSet(12, set), ctEstablished(), verdict(expr.VerdictAccept))
	}
	add(out, verdict(expr.VerdictDrop))
	add(in, verdict(expr.VerdictDrop)) // nothing dials into a sandbox through the forward path
}

// delSandboxRules removes the chains and jumps of the given keys.
func (m *Manager) delSandboxRules(keys map[string]bool) error {
	return m.delRules(func(key string) bool { return keys[key] })
}

// delSandboxRulesExcept removes the chains and jumps of every key not in
// keep.
func (m *Manager) delSandboxRulesExcept(keep map[string]bool) error {
	return m.delRules(func(key string) bool { return !keep[key] })
}

// delRules deletes what del selects in one batch. A batch that names an
// object gone since it was listed fails whole with ENOENT (seen once in CI,
// tearing down a sandbox, with other servers' tables changing on the
// host); listing again converges on nothing of the keys left, which is all
// a teardown wants.
func (m *Manager) delRules(del func(key string) bool) error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	var err error
	for range 3 {
		if err = m.delRulesOnce(del); !errors.Is(err, unix.ENOENT) {
			return err
		}
		m.log.Warn("an nftables object went while its sandbox's rules were deleted; listing them again", "err", err)
	}
	return err
}

// delRulesOnce is one listing and batch of delRules; callers hold nftMu.
func (m *Manager) delRulesOnce(del func(key string) bool) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := m.tbl()
	n := 0
	for _, name := range []string{chainEgress, chainIngress, chainHostDNS} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: name, Table: t})
		if err != nil {
			return fmt.Errorf("list rules of %s: %w", name, err)
		}
		for _, r := range rules {
			key, ok := userdata.GetString(r.UserData, userdata.TypeComment)
			if ok && del(key) {
				if err := c.DelRule(r); err != nil {
					return err
				}
				n++
			}
		}
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Table.Name != m.table {
			continue
		}
		key, ok := m.chainKey(ch.Name)
		if ok && del(key) {
			c.FlushChain(ch)
			c.DelChain(ch)
			n++
		}
	}
	// The sets and counters go after the chains whose rules use them.
	sets, err := c.GetSets(t)
	if err != nil {
		return fmt.Errorf("list sets: %w", err)
	}
	for _, s := range sets {
		if key, ok := m.chainKey(s.Name); ok && del(key) {
			c.DelSet(&nftables.Set{Table: t, Name: s.Name})
			n++
		}
	}
	objs, err := c.GetObjects(t)
	if err != nil {
		return fmt.Errorf("list counters: %w", err)
	}
	for _, o := range objs {
		co, ok := o.(*nftables.CounterObj)
		if !ok {
			continue
		}
		if key, ok := m.chainKey(co.Name); ok && del(key) {
			c.DeleteObject(&nftables.CounterObj{Table: t, Name: co.Name})
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete sandbox rules: %w", err)
	}
	return nil
}

// chainKey is the sandbox key of a per-sandbox chain's or counter's name.
func (m *Manager) chainKey(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, m.opts.Prefix+"-")
	if !ok {
		return "", false
	}
	for _, suf := range []string{"-out", "-in", "-tx", "-rx", "-host", "-dns"} {
		if key, ok := strings.CutSuffix(rest, suf); ok && keyPattern.MatchString(key) {
			return key, true
		}
	}
	return "", false
}

// Rule building blocks; each returns expressions to concatenate.

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(k expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k, Chain: chain}}
}

// ifname matches an interface name: exactly, or by prefix (nft's "p*").
func ifname(key expr.MetaKey, name string, exact bool) []expr.Any {
	data := []byte(name)
	if exact {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}
}

func ifnameNeq(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte(prefix)},
	}
}

func nfproto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// ipAddr matches the IPv4 address at offset (12 source, 16 destination)
// against a prefix.
func ipAddr(offset uint32, p netip.Prefix) []expr.Any {
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = []byte{0, 0, 0, 0}
	}
	a := p.Masked().Addr().As4()
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

// inSet matches an IPv4 address at offset that is in set.
func inSet(offset uint32, set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// allowAddrs adds addrs to key's set for timeout, or renews their
// timeout: each is added (a no-op when there), deleted and added again,
// in one transaction.
func (m *Manager) allowAddrs(key string, addrs []netip.Addr, timeout time.Duration) error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	set := m.addrSetOf(key)
	var els []nftables.SetElement
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			els = append(els, nftables.SetElement{Key: a.AsSlice(), Timeout: timeout})
		}
	}
	if len(els) == 0 {
		return nil
	}
	for _, step := range []func(*nftables.Set, []nftables.SetElement) error{c.SetAddElements, c.SetDeleteElements, c.SetAddElements} {
		if err := step(set, els); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("add to set %s: %w", set.Name, err)
	}
	return nil
}

// ipAddrNeq matches an IPv4 address at offset that is not in the prefix.
func ipAddrNeq(offset uint32, p netip.Prefix) []expr.Any {
	e := ipAddr(offset, p)
	e[len(e)-1].(*expr.Cmp).Op = expr.CmpOpNeq
	return e
}

func l4dport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
	}
}

// ctStateIs matches a packet whose conntrack state has one of bits.
func ctStateIs(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, bits),
			Xor:  []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

func ctEstablished() []expr.Any {
	return ctStateIs(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)
}

func (m *Manager) deleteTable() error {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelTable(m.tbl())
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete nftables table %s: %w", m.table, err)
	}
	return nil
}
