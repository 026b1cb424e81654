package netpol

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/sandboxd/sandboxd/internal/dnsguard"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// The test "internet": a namespace behind a veth from the host, on
// TEST-NET-2, with HTTP servers on several addresses. Host routes send the
// metadata address and a private range there too, so that only the deny
// list (not a missing route) can keep a sandbox from them.
var (
	inetHost     = netip.MustParseAddr("198.51.100.1")
	inetA        = netip.MustParseAddr("198.51.100.2")
	inetB        = netip.MustParseAddr("198.51.100.3")
	inetDomain   = netip.MustParseAddr("198.51.100.4") // what "internet.test" resolves to
	inetDNS      = netip.MustParseAddr("198.51.100.53")
	inetMetadata = netip.MustParseAddr("169.254.169.254")
	inetPrivate  = netip.MustParseAddr("10.99.0.1")
)

const testDomain = "internet.test"

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
}

// inNetns runs fn on a thread in the namespace at path; the thread is
// thrown away afterwards.
func inNetns(path string, fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			ch <- err
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- err
			return
		}
		ch <- fn()
	}()
	return <-ch
}

// listenIn listens on addr inside the namespace at path.
func listenIn(t testing.TB, path, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	if err := inNetns(path, func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, path, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// serveHTTP answers every request with "hello from ADDR".
func serveHTTP(l net.Listener) {
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", l.Addr())
	}))
}

// guestGet fetches url from inside the namespace at path, as a sandbox
// would.
func guestGet(path, url string) (string, error) {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(path, func() (err error) {
				c, err = (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	cl := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

type internet struct {
	netns string
	link  string
	dns   *fakeDNS
}

// fakeDNS is the test internet's resolver, on inetDNS port 53: A records
// from a table the test may change, NXDOMAIN for other names.
type fakeDNS struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr // FQDN -> addresses
}

func (f *fakeDNS) set(name string, addrs ...netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers[dns.Fqdn(name)] = addrs
}

func (f *fakeDNS) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	as, ok := f.answers[strings.ToLower(q.Name)]
	if !ok {
		m.Rcode = dns.RcodeNameError
	}
	for _, a := range as {
		if q.Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 30}, A: a.AsSlice()})
		}
	}
	_ = w.WriteMsg(m)
}

// newInternet builds the test internet and its servers.
func newInternet(t testing.TB) *internet {
	t.Helper()
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	suffix := hex.EncodeToString(rb[:])
	in := &internet{netns: "tin-" + suffix, link: "tin" + suffix,
		dns: &fakeDNS{answers: map[string][]netip.Addr{testDomain + ".": {inetDomain}}}}
	ns, err := newNamedNetns(in.netns)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	t.Cleanup(func() {
		_ = delLink(in.link)
		_ = delNetns(in.netns)
	})
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: in.link}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		t.Fatal(err)
	}
	host, err := netlink.LinkByName(in.link)
	if err != nil {
		t.Fatal(err)
	}
	must(t, netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(inetHost, 24)}))
	must(t, netlink.LinkSetUp(host))
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, _ := h.LinkByName("lo")
	must(t, h.LinkSetUp(lo))
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{inetA, inetB, inetDomain, inetDNS} {
		must(t, h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(a, 24)}))
	}
	for _, a := range []netip.Addr{inetMetadata, inetPrivate} {
		must(t, h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(a, 32)}))
	}
	must(t, h.LinkSetUp(eth))
	must(t, h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: inetHost.AsSlice()}))
	for _, a := range []netip.Addr{inetMetadata, inetPrivate} {
		must(t, netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipNet(a, 32), Gw: inetA.AsSlice()}))
	}
	path := filepath.Join(netnsDir, in.netns)
	for _, a := range []netip.Addr{inetA, inetB, inetDomain, inetMetadata, inetPrivate} {
		serveHTTP(listenIn(t, path, netip.AddrPortFrom(a, 80).String()))
	}
	// The internet's resolver, which sandboxes' resolvers ask and
	// sandboxes themselves may not.
	var pc net.PacketConn
	if err := inNetns(path, func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(inetDNS, 53).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: in.dns}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return in
}

// hostIPv4s are the host's IPv4 addresses: 127.0.0.1 and every one of its
// links'.
func hostIPv4s(t *testing.T) []netip.Addr {
	t.Helper()
	out := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && !ip.IsLoopback() {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newManager makes a Manager with the test's prefix, pool and resolvers;
// the test's end removes everything it made.
func newManager(t testing.TB, prefix string, pool string, mod func(*Options)) *Manager {
	t.Helper()
	requireRoot(t)
	opts := Options{
		StateDir: t.TempDir(),
		Prefix:   prefix,
		Pool:     netip.MustParsePrefix(pool),
		DNS:      []netip.Addr{inetDNS},
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mod != nil {
		mod(&opts)
	}
	m, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Uninstall(context.Background()); err != nil {
			t.Errorf("uninstall: %v", err)
		}
	})
	return m
}

func urlOf(a netip.Addr, port int) string {
	return "http://" + netip.AddrPortFrom(a, uint16(port)).String() + "/"
}

func TestPolicy(t *testing.T) {
	requireRoot(t)
	newInternet(t)
	m := newManager(t, "tnp", "10.201.0.0/16", nil)
	ctx := context.Background()

	none, err := m.Setup(ctx, "sb-none", Policy{Mode: ModeNone})
	if err != nil || none != nil {
		t.Fatalf("Setup(none) = %v, %v; want nil, nil", none, err)
	}
	egress, err := m.Setup(ctx, "sb-egress", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	allow, err := m.Setup(ctx, "sb-allow", Policy{Mode: ModeAllow, Allow: []string{inetA.String(), testDomain}})
	if err != nil {
		t.Fatal(err)
	}

	// The host's sandboxd port: a listener on every host address.
	hostL, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostL.Close()
	serveHTTP(hostL)
	hostPort := hostL.Addr().(*net.TCPAddr).Port
	if _, err := http.Get(urlOf(egress.HostAddr, hostPort)); err != nil {
		t.Fatalf("the host listener does not answer on the veth address from the host: %v", err)
	}
	hostAddrs := hostIPv4s(t)
	// The allow list's domain is reachable once the guest looks it up.
	if got, err := guestLookup(allow.Netns, allow.HostAddr, testDomain); err != nil || !slices.Equal(got, []netip.Addr{inetDomain}) {
		t.Fatalf("look up %s: %v, %v", testDomain, got, err)
	}
	// Listeners inside each sandbox, for sandbox-to-sandbox checks.
	for _, n := range []*Network{egress, allow} {
		serveHTTP(listenIn(t, n.Netns, netip.AddrPortFrom(n.GuestAddr, 8080).String()))
	}

	type check struct {
		from  *Network
		url   string
		reach bool
	}
	var checks []check
	for _, n := range []*Network{egress, allow} {
		for _, a := range hostAddrs {
			checks = append(checks, check{n, urlOf(a, hostPort), false})
		}
		checks = append(checks,
			check{n, urlOf(inetMetadata, 80), false},
			check{n, urlOf(inetPrivate, 80), false},
		)
	}
	checks = append(checks,
		check{egress, urlOf(allow.GuestAddr, 8080), false},
		check{allow, urlOf(egress.GuestAddr, 8080), false},
		check{egress, urlOf(inetA, 80), true},
		check{egress, urlOf(inetB, 80), true},
		check{egress, urlOf(inetDomain, 80), true},
		check{allow, urlOf(inetA, 80), true},
		check{allow, urlOf(inetDomain, 80), true},
		check{allow, urlOf(inetB, 80), false},
		check{allow, urlOf(inetDNS, 80), false}, // the resolver, but not port 53
	)
	var wg sync.WaitGroup
	for _, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := guestGet(c.from.Netns, c.url)
			switch {
			case c.reach && err != nil:
				t.Errorf("%s (%s) cannot reach %s: %v", c.from.ID, c.from.Policy.Mode, c.url, err)
			case c.reach && !strings.HasPrefix(body, "hello from"):
				t.Errorf("%s (%s) got %q from %s", c.from.ID, c.from.Policy.Mode, body, c.url)
			case !c.reach && err == nil:
				t.Errorf("%s (%s) reached %s: %q", c.from.ID, c.from.Policy.Mode, c.url, body)
			}
		}()
	}
	// DNS goes to the sandbox's own resolver only, in both modes; not to
	// the configured resolver, nor to another sandbox's.
	for _, n := range []*Network{egress, allow} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := guestLookup(n.Netns, n.HostAddr, testDomain); err != nil {
				t.Errorf("%s (%s): DNS to its gateway: %v", n.ID, n.Policy.Mode, err)
			}
			if _, err := guestLookup(n.Netns, inetDNS, testDomain); err == nil {
				t.Errorf("%s (%s): DNS to %s gets through", n.ID, n.Policy.Mode, inetDNS)
			}
		}()
	}
	if _, err := guestLookup(egress.Netns, allow.HostAddr, testDomain); err == nil {
		t.Errorf("DNS to another sandbox's resolver gets through")
	}
	wg.Wait()
	if got := egress.Nameservers(); !slices.Equal(got, []string{egress.HostAddr.String()}) {
		t.Errorf("nameservers = %q, want the gateway %s", got, egress.HostAddr)
	}
}

// errNoSuchName is guestLookup's error for NXDOMAIN.
var errNoSuchName = errors.New("no such name")

// guestLookup asks server (port 53) for name's A records from inside the
// namespace at path, as a sandbox would.
func guestLookup(path string, server netip.Addr, name string) ([]netip.Addr, error) {
	var c net.Conn
	if err := inNetns(path, func() (err error) {
		c, err = net.Dial("udp", netip.AddrPortFrom(server, 53).String())
		return err
	}); err != nil {
		return nil, err
	}
	co := &dns.Conn{Conn: c}
	defer co.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	if err := co.WriteMsg(q); err != nil {
		return nil, err
	}
	r, err := co.ReadMsg()
	if err != nil {
		return nil, err
	}
	if r.Rcode == dns.RcodeNameError {
		return nil, errNoSuchName
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
	}
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ad, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ad)
		}
	}
	return out, nil
}

// TestAllowPrivate: an operator's private exception opens that range and
// nothing of the hard deny list.
func TestAllowPrivate(t *testing.T) {
	requireRoot(t)
	newInternet(t)
	m := newManager(t, "tnq", "10.202.0.0/16", func(o *Options) {
		o.AllowPrivate = []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24"), netip.MustParsePrefix("169.254.0.0/16")}
	})
	n, err := m.Setup(context.Background(), "sb-private", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := guestGet(n.Netns, urlOf(inetPrivate, 80)); err != nil {
		t.Errorf("allowed private address: %v", err)
	}
	if body, err := guestGet(n.Netns, urlOf(inetMetadata, 80)); err == nil {
		t.Errorf("metadata reachable although only private ranges may be allowed: %q", body)
	}
}

// TestConnLimit: the connection beyond MaxConns is dropped.
func TestConnLimit(t *testing.T) {
	requireRoot(t)
	newInternet(t)
	const limit = 4
	m := newManager(t, "tnr", "10.203.0.0/16", func(o *Options) { o.MaxConns = limit })
	n, err := m.Setup(context.Background(), "sb-conns", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range limit + 1 {
		var c net.Conn
		err := inNetns(n.Netns, func() (err error) {
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(inetA, 80).String(), time.Second)
			return err
		})
		if i < limit && err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, limit, err)
		}
		if i == limit && err == nil {
			t.Fatalf("connection %d got through a limit of %d", i+1, limit)
		}
		if c != nil {
			conns = append(conns, c)
		}
	}
}

// TestRateLimit: a sandbox's traffic is held to RateBytes each way (after
// a burst of BurstBytes). Only a lower bound on the transfer's time is
// checked: a slow machine can only make it slower.
func TestRateLimit(t *testing.T) {
	requireRoot(t)
	inet := newInternet(t)
	const (
		rate  = 256 << 10
		burst = 32 << 10
		size  = 1 << 20
	)
	m := newManager(t, "tnb", "10.213.0.0/16", func(o *Options) { o.RateBytes, o.BurstBytes = rate, burst })
	n, err := m.Setup(context.Background(), "sb-rate", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	// A server on A that sends size bytes, or reads to EOF and says how
	// much it got.
	l := listenIn(t, filepath.Join(netnsDir, inet.netns), netip.AddrPortFrom(inetA, 9100).String())
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			got, _ := io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "%d", got)
			return
		}
		_, _ = io.CopyN(w, zeros{}, size)
	}))
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := inNetns(n.Netns, func() (err error) {
				c, err = (&net.Dialer{Timeout: time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	url := "http://" + netip.AddrPortFrom(inetA, 9100).String() + "/"
	// The least time size bytes can take: what is above a full bucket, at
	// the rate, less a tenth for the clock's grain. nftables' byte limit
	// holds a second of the rate on top of the burst.
	least := time.Duration(int64(size-rate-burst) * 9 * int64(time.Second) / (10 * rate))

	start := time.Now()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	down := time.Since(start)
	if err != nil || got != size {
		t.Fatalf("download: %d bytes, %v", got, err)
	}
	start = time.Now()
	resp, err = client.Post(url, "application/octet-stream", io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	up := time.Since(start)
	if string(body) != fmt.Sprint(size) {
		t.Fatalf("upload: the server got %q bytes of %d", body, size)
	}
	t.Logf("%d KiB at a limit of %d KiB/s: down in %v (%.0f KiB/s), up in %v (%.0f KiB/s)",
		size>>10, rate>>10, down.Round(time.Millisecond), float64(size>>10)/down.Seconds(), up.Round(time.Millisecond), float64(size>>10)/up.Seconds())
	if down < least || up < least {
		t.Errorf("faster than the limit allows: down %v, up %v, at least %v each", down, up, least)
	}
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// leftovers lists what m has on the host: namespaces, links, per-sandbox
// chains and jump rules, records.
func leftovers(t *testing.T, m *Manager) []string {
	t.Helper()
	var out []string
	nss, err := listNetns(m.opts.Prefix + "-")
	must(t, err)
	for _, ns := range nss {
		out = append(out, "netns "+ns)
	}
	links, err := listLinks(m.opts.Prefix)
	must(t, err)
	for _, l := range links {
		out = append(out, "link "+l)
	}
	c, err := nftables.New()
	must(t, err)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	must(t, err)
	for _, ch := range chains {
		if ch.Table.Name == m.table {
			if _, ok := m.chainKey(ch.Name); ok {
				out = append(out, "chain "+ch.Name)
			}
		}
	}
	t2 := m.tbl()
	for _, name := range []string{chainEgress, chainIngress, chainHostDNS} {
		rules, err := c.GetRules(t2, &nftables.Chain{Name: name, Table: t2})
		must(t, err)
		for range rules {
			out = append(out, "rule in "+name)
		}
	}
	sets, err := c.GetSets(t2)
	must(t, err)
	for _, s := range sets {
		out = append(out, "set "+s.Name)
	}
	objs, err := c.GetObjects(t2)
	must(t, err)
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok {
			out = append(out, "counter "+co.Name)
		}
	}
	recs, err := m.records()
	must(t, err)
	for _, r := range recs {
		out = append(out, "record "+r.ID)
	}
	return out
}

func TestTeardownLeavesNothing(t *testing.T) {
	requireRoot(t)
	newInternet(t)
	m := newManager(t, "tns", "10.204.0.0/16", nil)
	ctx := context.Background()
	for i := range 20 {
		id := fmt.Sprintf("sb-%02d", i)
		p := Policy{Mode: ModeEgress}
		if i%2 == 1 {
			p = Policy{Mode: ModeAllow, Allow: []string{"198.51.100.0/24"}}
		}
		n, err := m.Setup(ctx, id, p)
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 || i == 19 {
			if _, err := guestGet(n.Netns, urlOf(inetA, 80)); err != nil {
				t.Errorf("%s: %v", id, err)
			}
		}
		if err := m.Teardown(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := m.Teardown(ctx, id); err != nil {
			t.Fatalf("second teardown: %v", err)
		}
	}
	if l := leftovers(t, m); len(l) > 0 {
		t.Errorf("left after 20 setups and teardowns: %v", l)
	}
}

// TestReconcileAfterCrash: a Manager dies with networks up and half-made
// objects around; a new one on the same state keeps the live sandbox's
// network working and removes everything else.
func TestReconcileAfterCrash(t *testing.T) {
	requireRoot(t)
	newInternet(t)
	m := newManager(t, "tnt", "10.205.0.0/16", nil)
	ctx := context.Background()
	for _, id := range []string{"gone-1", "kept", "gone-2"} {
		if _, err := m.Setup(ctx, id, Policy{Mode: ModeEgress}); err != nil {
			t.Fatal(err)
		}
	}
	// A crash mid-setup: objects with no record.
	orphan := "0123456789"
	ns, err := newNamedNetns(m.netnsName(orphan))
	must(t, err)
	defer ns.Close()
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: m.linkName(orphan)}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}))
	must(t, m.addSandboxRules(&Network{Key: orphan, HostIf: m.linkName(orphan), Policy: Policy{Mode: ModeEgress}}))

	// The crash: the dead process's resolvers die with it.
	m.recMu.Lock()
	for key := range m.guards {
		must(t, m.stopGuard(key))
	}
	m.recMu.Unlock()

	m2, err := New(ctx, m.opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Reconcile(ctx, func(id string) bool { return id == "kept" }); err != nil {
		t.Fatal(err)
	}
	kept, err := m2.Get("kept")
	if err != nil || kept == nil {
		t.Fatalf("Get(kept) = %v, %v", kept, err)
	}
	if gone, _ := m2.Get("gone-1"); gone != nil {
		t.Errorf("gone-1 still has a network")
	}
	want := []string{"netns " + m.netnsName(kept.Key), "link " + kept.HostIf,
		"chain " + m.outChain(kept.Key), "chain " + m.inChain(kept.Key),
		"chain " + m.hostChain(kept.Key), "set " + m.addrSet(kept.Key), "rule in " + chainHostDNS,
		"rule in egress", "rule in ingress", "counter " + m.txCounter(kept.Key), "counter " + m.rxCounter(kept.Key), "record kept"}
	got := leftovers(t, m2)
	if fmt.Sprint(sorted(got)) != fmt.Sprint(sorted(want)) {
		t.Errorf("after reconcile: %v, want %v", got, want)
	}
	if _, err := guestGet(kept.Netns, urlOf(inetA, 80)); err != nil {
		t.Errorf("kept sandbox lost egress: %v", err)
	}
	if _, err := guestLookup(kept.Netns, kept.HostAddr, testDomain); err != nil {
		t.Errorf("kept sandbox's resolver is not back: %v", err)
	}
	// The freed slots are handed out again; the kept one is not.
	n, err := m2.Setup(ctx, "new", Policy{Mode: ModeEgress})
	must(t, err)
	if n.GuestAddr == kept.GuestAddr {
		t.Errorf("new sandbox got the kept one's address %s", n.GuestAddr)
	}
	must(t, m2.Teardown(ctx, "new"))
	must(t, m2.Teardown(ctx, "kept"))
	if l := leftovers(t, m2); len(l) > 0 {
		t.Errorf("left after teardown: %v", l)
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// BenchmarkSetupTeardown measures one sandbox network's setup and teardown.
func BenchmarkSetupTeardown(b *testing.B) {
	m := newManager(b, "tnb", "10.206.0.0/16", nil)
	ctx := context.Background()
	var setup, teardown time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		if _, err := m.Setup(ctx, id, Policy{Mode: ModeEgress}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
		setup += t1.Sub(t0)
		teardown += time.Since(t1)
	}
	b.ReportMetric(float64(setup.Microseconds())/float64(b.N)/1000, "setup-ms/op")
	b.ReportMetric(float64(teardown.Microseconds())/float64(b.N)/1000, "teardown-ms/op")
}

// TestUpdate replaces a running sandbox's policy: new and open connections
// follow the new policy at once, in both directions; none cuts DNS too; a
// sandbox without a network and a bad policy are refused, the old policy
// staying in force.
func TestUpdate(t *testing.T) {
	requireRoot(t)
	inet := newInternet(t)
	// A sink on A: reads to EOF, then says how much it got.
	sink := listenIn(t, filepath.Join(netnsDir, inet.netns), netip.AddrPortFrom(inetA, 9000).String())
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, c)
			fmt.Fprintf(c, "%d", n)
			c.Close()
		}
	}()
	m := newManager(t, "tnu", "10.206.0.0/16", nil)
	ctx := context.Background()
	n, err := m.Setup(ctx, "sb-update", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	reach := func(a netip.Addr) bool {
		_, err := guestGet(n.Netns, urlOf(a, 80))
		return err == nil
	}
	// A keep-alive connection to B, opened under egress.
	var open net.Conn
	must(t, inNetns(n.Netns, func() (err error) {
		open, err = net.DialTimeout("tcp", netip.AddrPortFrom(inetB, 80).String(), time.Second)
		return err
	}))
	defer open.Close()
	request := func() error {
		_ = open.SetDeadline(time.Now().Add(time.Second))
		if _, err := io.WriteString(open, "GET / HTTP/1.1\r\nHost: b\r\n\r\n"); err != nil {
			return err
		}
		buf := make([]byte, 512)
		n, err := open.Read(buf)
		if err == nil && !strings.Contains(string(buf[:n]), "hello from") {
			err = fmt.Errorf("answer %q", buf[:n])
		}
		return err
	}
	if err := request(); err != nil {
		t.Fatalf("open connection under egress: %v", err)
	}
	// 1 MiB up to the sink, counted with headers on the sandbox's side.
	const upload = 1 << 20
	before := traffic(t, m, "sb-update")
	var c net.Conn
	must(t, inNetns(n.Netns, func() (err error) {
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(inetA, 9000).String(), time.Second)
		return err
	}))
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Write(make([]byte, upload))
	if err == nil {
		err = c.(*net.TCPConn).CloseWrite()
	}
	got, rerr := io.ReadAll(c)
	c.Close()
	if err != nil || rerr != nil || string(got) != fmt.Sprint(upload) {
		t.Fatalf("upload: %v, %v, sink got %q", err, rerr, got)
	}
	after := traffic(t, m, "sb-update")
	if sent := after.TxBytes - before.TxBytes; sent < upload || sent > upload*11/10 {
		t.Fatalf("counted %d bytes sent for a %d byte upload", sent, upload)
	}
	if after.RxBytes <= before.RxBytes || after.TxPackets <= before.TxPackets {
		t.Fatalf("traffic %+v -> %+v: nothing received counted", before, after)
	}

	if _, err := m.Update(ctx, "sb-update", Policy{Mode: ModeAllow, Allow: []string{inetA.String()}}); err != nil {
		t.Fatal(err)
	}
	if !reach(inetA) || reach(inetB) {
		t.Fatalf("after allow [A]: A reachable %v, B reachable %v; want A only", reach(inetA), reach(inetB))
	}
	if err := request(); err == nil {
		t.Fatal("the connection to B opened under egress still works under allow [A]")
	}
	if _, err := guestLookup(n.Netns, n.HostAddr, testDomain); !errors.Is(err, errNoSuchName) {
		t.Errorf("DNS under allow [A] for a name not on it: %v, want no such name", err)
	}
	if rec, err := m.Get("sb-update"); err != nil || rec.Policy.Mode != ModeAllow {
		t.Fatalf("record after the update: %+v, %v", rec, err)
	}
	if tr := traffic(t, m, "sb-update"); tr.TxBytes < after.TxBytes {
		t.Fatalf("traffic after the update %+v < before it %+v: the counters were reset", tr, after)
	}

	if _, err := m.Update(ctx, "sb-update", Policy{Mode: ModeNone}); err != nil {
		t.Fatal(err)
	}
	if reach(inetA) {
		t.Fatal("A reachable under none")
	}
	if _, err := guestLookup(n.Netns, n.HostAddr, testDomain); err == nil {
		t.Fatal("DNS gets through under none")
	}

	if _, err := m.Update(ctx, "sb-update", Policy{Mode: ModeAllow}); err == nil {
		t.Fatal("an empty allow list was accepted")
	}
	if _, err := m.Update(ctx, "sb-update", Policy{Mode: ModeAllow, Allow: []string{"*"}}); err == nil {
		t.Fatal("an allow list with a bare wildcard was accepted")
	}
	if reach(inetA) {
		t.Fatal("a refused update changed the policy in force")
	}
	if _, err := m.Update(ctx, "sb-update", Policy{Mode: ModeEgress}); err != nil {
		t.Fatal(err)
	}
	if !reach(inetA) || !reach(inetB) || reach(inetMetadata) || reach(inetPrivate) {
		t.Fatalf("back under egress: A %v, B %v, metadata %v, private %v", reach(inetA), reach(inetB), reach(inetMetadata), reach(inetPrivate))
	}
	if tr, err := m.Traffic("sb-other"); tr != nil || err != nil {
		t.Fatalf("traffic of a sandbox without a network: %+v, %v", tr, err)
	}
	if _, err := m.Update(ctx, "sb-other", Policy{Mode: ModeEgress}); !errors.Is(err, ErrNoNetwork) {
		t.Fatalf("update of a sandbox without a network: %v, want ErrNoNetwork", err)
	}
	must(t, m.Teardown(ctx, "sb-update"))
	if left := leftovers(t, m); len(left) > 0 {
		t.Fatalf("left after teardown: %v", left)
	}
}

func traffic(t *testing.T, m *Manager, id string) Traffic {
	t.Helper()
	tr, err := m.Traffic(id)
	if err != nil || tr == nil {
		t.Fatalf("traffic of %s: %+v, %v", id, tr, err)
	}
	return *tr
}

// TestDomainRules: an allow list's domains are enforced by the sandbox's
// resolver. An address is reachable once an allowed name resolved to it; a
// name whose answer changes mid-run keeps working; a denied name sharing an
// allowed one's address does not resolve; wildcards match below their
// domain; an allowed name resolving into the deny list stays unreachable.
func TestDomainRules(t *testing.T) {
	requireRoot(t)
	inet := newInternet(t)
	inet.dns.set("moving.test", inetA)
	inet.dns.set("denied.test", inetA)
	inet.dns.set("a.b.wild.test", inetB)
	inet.dns.set("wild.test", inetB)
	inet.dns.set("meta.test", inetMetadata)
	m := newManager(t, "tnd", "10.207.0.0/16", nil)
	ctx := context.Background()
	n, err := m.Setup(ctx, "sb-domains", Policy{Mode: ModeAllow, Allow: []string{"moving.test", "*.wild.test", "meta.test"}})
	if err != nil {
		t.Fatal(err)
	}
	get := func(name string) error {
		addrs, err := guestLookup(n.Netns, n.HostAddr, name)
		if err != nil {
			return fmt.Errorf("look up %s: %w", name, err)
		}
		if len(addrs) == 0 {
			return fmt.Errorf("look up %s: no address", name)
		}
		body, err := guestGet(n.Netns, urlOf(addrs[0], 80))
		if err == nil && body != fmt.Sprintf("hello from %s", netip.AddrPortFrom(addrs[0], 80)) {
			err = fmt.Errorf("answer %q", body)
		}
		return err
	}
	if _, err := guestGet(n.Netns, urlOf(inetA, 80)); err == nil {
		t.Fatal("A reachable before any name resolved to it")
	}
	if err := get("moving.test"); err != nil {
		t.Fatal(err)
	}
	// The name moves to B mid-run: the next lookup gets, and opens, B.
	inet.dns.set("moving.test", inetB)
	if err := get("moving.test"); err != nil {
		t.Fatalf("after the answer changed: %v", err)
	}
	if got, err := guestLookup(n.Netns, n.HostAddr, "moving.test"); err != nil || !slices.Equal(got, []netip.Addr{inetB}) {
		t.Fatalf("moving.test after the change = %v, %v; want %s", got, err, inetB)
	}
	if _, err := guestLookup(n.Netns, n.HostAddr, "denied.test"); !errors.Is(err, errNoSuchName) {
		t.Errorf("denied.test, sharing moving.test's address: %v, want no such name", err)
	}
	if err := get("a.b.wild.test"); err != nil {
		t.Errorf("wildcard: %v", err)
	}
	if _, err := guestLookup(n.Netns, n.HostAddr, "wild.test"); !errors.Is(err, errNoSuchName) {
		t.Errorf("a wildcard's apex: %v, want no such name", err)
	}
	if err := get("meta.test"); err == nil {
		t.Error("an allowed name resolving to the metadata address reached it")
	}
	// The resolver's answers are in the sandbox's set, with timeouts.
	c, err := nftables.New()
	must(t, err)
	els, err := c.GetSetElements(m.addrSetOf(n.Key))
	must(t, err)
	var inSet []string
	for _, e := range els {
		a, _ := netip.AddrFromSlice(e.Key)
		inSet = append(inSet, a.String())
		if e.Timeout == 0 {
			t.Errorf("set element %s has no timeout", a)
		}
		// Traffic to an address renews it for MaxTTL; the metadata
		// address, denied before the set is looked at, keeps the
		// answer's (the floor: the fake's TTL is 30s).
		switch renewed := e.Expires > dnsguard.MinTTL; {
		case a == inetMetadata && renewed:
			t.Errorf("set element %s renewed (expires in %s) by traffic the deny list dropped", a, e.Expires)
		case a != inetMetadata && !renewed:
			t.Errorf("set element %s expires in %s: traffic did not renew it", a, e.Expires)
		}
	}
	if want := []string{inetA.String(), inetB.String(), inetMetadata.String()}; !slices.Equal(sorted(inSet), sorted(want)) {
		t.Errorf("set = %v, want %v", inSet, want)
	}
	// A new policy replaces the names the resolver answers, and what it
	// answered before.
	if _, err := m.Update(ctx, "sb-domains", Policy{Mode: ModeAllow, Allow: []string{"denied.test"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := guestGet(n.Netns, urlOf(inetB, 80)); err == nil {
		t.Error("B reachable after an update dropped the names that resolved to it")
	}
	if _, err := guestLookup(n.Netns, n.HostAddr, "moving.test"); !errors.Is(err, errNoSuchName) {
		t.Errorf("moving.test after the update: %v, want no such name", err)
	}
	if err := get("denied.test"); err != nil {
		t.Errorf("denied.test after the update allowed it: %v", err)
	}
	must(t, m.Teardown(ctx, "sb-domains"))
	if left := leftovers(t, m); len(left) > 0 {
		t.Fatalf("left after teardown: %v", left)
	}
}

// TestUpdateLegacy: a network an older sandboxd set up (no resolver of
// its own) takes new addresses, and refuses domains it could not enforce.
func TestUpdateLegacy(t *testing.T) {
	requireRoot(t)
	m := newManager(t, "tnl", "10.208.0.0/16", nil)
	ctx := context.Background()
	n, err := m.Setup(ctx, "sb-legacy", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	// What an older sandboxd left: a record without a resolver.
	rec, err := m.readRecord(n.Key)
	must(t, err)
	rec.Resolver = false
	must(t, m.replaceRecord(rec))
	m.recMu.Lock()
	must(t, m.stopGuard(n.Key))
	m.recMu.Unlock()
	if got, _ := m.Get("sb-legacy"); !slices.Equal(got.Nameservers(), []string{inetDNS.String()}) {
		t.Fatalf("legacy nameservers = %v, want the configured %s", got.Nameservers(), inetDNS)
	}
	if _, err := m.Update(ctx, "sb-legacy", Policy{Mode: ModeAllow, Allow: []string{"example.test"}}); !errors.Is(err, ErrNoResolver) {
		t.Fatalf("domains for a legacy network: %v, want ErrNoResolver", err)
	}
	if _, err := m.Update(ctx, "sb-legacy", Policy{Mode: ModeAllow, Allow: []string{inetA.String()}}); err != nil {
		t.Fatalf("an address for a legacy network: %v", err)
	}
	must(t, m.Teardown(ctx, "sb-legacy"))
}
