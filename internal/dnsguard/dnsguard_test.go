package dnsguard

import (
	"net"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeUpstream is a resolver on loopback answering A queries from a table
// the test changes.
type fakeUpstream struct {
	mu      sync.Mutex
	answers map[string][]string // name (FQDN) -> addresses
	ttl     uint32
	queries int
	addr    netip.AddrPort
}

func startUpstream(t *testing.T, ttl uint32, answers map[string][]string) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{answers: answers, ttl: ttl}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.mu.Lock()
		defer u.mu.Unlock()
		u.queries++
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		as, ok := u.answers[q.Name]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		if q.Qtype == dns.TypeA {
			for _, a := range as {
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: u.ttl},
					A:   net.ParseIP(a).To4(),
				})
			}
		}
		if q.Qtype == dns.TypeTXT && ok {
			m.Answer = append(m.Answer, &dns.TXT{
				Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: u.ttl},
				Txt: []string{"hello"},
			})
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

func (u *fakeUpstream) set(name string, addrs ...string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.answers[name] = addrs
}

type recorded struct {
	addrs   []netip.Addr
	timeout time.Duration
}

// freePort is a port free on 127.0.0.1 for UDP and TCP just now.
func freePort(t *testing.T) uint16 {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp4", "127.0.0.1:"+strconv.Itoa(port))
		pc.Close()
		if err == nil {
			l.Close()
			return uint16(port)
		}
	}
	t.Fatal("no free port")
	return 0
}

func startGuard(t *testing.T, up *fakeUpstream, rules Rules, opts Options) (*Server, string, *[]recorded, *sync.Mutex) {
	t.Helper()
	var mu sync.Mutex
	var recs []recorded
	opts.Addr = netip.MustParseAddr("127.0.0.1")
	opts.Port = freePort(t)
	opts.Upstream = []netip.AddrPort{up.addr}
	opts.Record = func(a []netip.Addr, d time.Duration) error {
		mu.Lock()
		defer mu.Unlock()
		recs = append(recs, recorded{a, d})
		return nil
	}
	s, err := Start(opts, rules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(opts.Port))), &recs, &mu
}

func query(t *testing.T, netw, server, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: netw, Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	resp, _, err := c.Exchange(m, server)
	if err != nil {
		t.Fatalf("query %s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return resp
}

func aRecords(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

func TestMatch(t *testing.T) {
	pats := []string{"example.com", "*.cdn.example.net"}
	for name, want := range map[string]bool{
		"example.com":             true,
		"EXAMPLE.com.":            true,
		"www.example.com":         false,
		"cdn.example.net":         false, // a wildcard is not its apex
		"a.cdn.example.net":       true,
		"a.b.cdn.example.net":     true, // any depth
		"xcdn.example.net":        false,
		"example.com.evil.test":   false,
		"":                        false,
		"a.cdn.example.net.evil.": false,
	} {
		if got := Match(pats, name); got != want {
			t.Errorf("Match(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestAllowedDeniedWildcard(t *testing.T) {
	up := startUpstream(t, 120, map[string][]string{
		"allowed.test.":     {"192.0.2.1"},
		"denied.test.":      {"192.0.2.1"}, // the same address as allowed.test
		"a.b.wild.test.":    {"192.0.2.7"},
		"wild.test.":        {"192.0.2.8"},
		"missing-ok.test.":  nil,
		"txt.allowed.test.": {"192.0.2.9"},
	})
	_, srv, recs, mu := startGuard(t, up, Rules{Names: []string{"allowed.test", "*.wild.test", "txt.allowed.test"}}, Options{})

	for _, netw := range []string{"udp", "tcp"} {
		r := query(t, netw, srv, "allowed.test", dns.TypeA)
		if r.Rcode != dns.RcodeSuccess || len(aRecords(r)) != 1 || aRecords(r)[0] != "192.0.2.1" {
			t.Errorf("%s allowed.test: %v", netw, r)
		}
	}
	if r := query(t, "udp", srv, "denied.test", dns.TypeA); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Errorf("denied.test: want NXDOMAIN, got %v", r)
	}
	if r := query(t, "udp", srv, "a.b.wild.test", dns.TypeA); len(aRecords(r)) != 1 {
		t.Errorf("a.b.wild.test: %v", r)
	}
	if r := query(t, "udp", srv, "wild.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("wild.test (apex of a wildcard): want NXDOMAIN, got %v", r)
	}
	if r := query(t, "udp", srv, "allowed.test", dns.TypeAAAA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("AAAA allowed.test: want an empty answer, got %v", r)
	}
	if r := query(t, "udp", srv, "txt.allowed.test", dns.TypeTXT); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("TXT of an allowed name: want an empty answer, got %v", r)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, rec := range *recs {
		for _, a := range rec.addrs {
			if a.String() != "192.0.2.1" && a.String() != "192.0.2.7" {
				t.Errorf("recorded %s, which no allowed name resolved to", a)
			}
		}
	}
	if len(*recs) != 3 { // allowed.test over UDP and TCP, a.b.wild.test
		t.Errorf("recorded %d answers, want 3: %v", len(*recs), *recs)
	}
}

func TestTTLToTimeout(t *testing.T) {
	for _, tc := range []struct {
		ttl     uint32
		timeout time.Duration
		seen    uint32 // the TTL the guest sees
	}{
		{0, MinTTL, 0},
		{600, 600 * time.Second, 600},
		{86400, MaxTTL, uint32(MaxTTL / time.Second)},
	} {
		up := startUpstream(t, tc.ttl, map[string][]string{"allowed.test.": {"192.0.2.1", "192.0.2.2"}})
		_, srv, recs, mu := startGuard(t, up, Rules{Names: []string{"allowed.test"}}, Options{})
		r := query(t, "udp", srv, "allowed.test", dns.TypeA)
		if len(r.Answer) != 2 || r.Answer[0].Header().Ttl != tc.seen {
			t.Errorf("TTL %d: answer %v, want TTL %d", tc.ttl, r.Answer, tc.seen)
		}
		mu.Lock()
		if len(*recs) != 1 || len((*recs)[0].addrs) != 2 || (*recs)[0].timeout != tc.timeout {
			t.Errorf("TTL %d: recorded %v, want both addresses for %s", tc.ttl, *recs, tc.timeout)
		}
		mu.Unlock()
	}
}

func TestChangingAnswer(t *testing.T) {
	up := startUpstream(t, 60, map[string][]string{"moving.test.": {"192.0.2.1"}})
	_, srv, recs, mu := startGuard(t, up, Rules{Names: []string{"moving.test"}}, Options{})
	query(t, "udp", srv, "moving.test", dns.TypeA)
	up.set("moving.test.", "198.51.100.5")
	if r := query(t, "udp", srv, "moving.test", dns.TypeA); len(aRecords(r)) != 1 || aRecords(r)[0] != "198.51.100.5" {
		t.Fatalf("after the change: %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(*recs) != 2 || (*recs)[1].addrs[0] != netip.MustParseAddr("198.51.100.5") {
		t.Errorf("recorded %v, want the new address second", *recs)
	}
}

func TestSetRulesAndEgress(t *testing.T) {
	up := startUpstream(t, 60, map[string][]string{"a.test.": {"192.0.2.1"}, "b.test.": {"192.0.2.2"}})
	s, srv, recs, mu := startGuard(t, up, Rules{Names: []string{"a.test"}}, Options{})
	if r := query(t, "udp", srv, "b.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Fatalf("b.test before the update: %v", r)
	}
	s.SetRules(Rules{Names: []string{"b.test"}})
	if r := query(t, "udp", srv, "b.test", dns.TypeA); len(aRecords(r)) != 1 {
		t.Errorf("b.test after the update: %v", r)
	}
	if r := query(t, "udp", srv, "a.test", dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("a.test after the update: %v", r)
	}
	s.SetRules(Rules{Any: true})
	mu.Lock()
	n := len(*recs)
	mu.Unlock()
	if r := query(t, "udp", srv, "a.test", dns.TypeA); len(aRecords(r)) != 1 {
		t.Errorf("egress a.test: %v", r)
	}
	if r := query(t, "udp", srv, "a.test", dns.TypeTXT); len(r.Answer) != 1 {
		t.Errorf("egress forwards other types: %v", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(*recs) != n {
		t.Errorf("egress recorded addresses: %v", (*recs)[n:])
	}
}

func TestHostileInput(t *testing.T) {
	up := startUpstream(t, 60, map[string][]string{"a.test.": {"192.0.2.1"}})
	_, srv, _, _ := startGuard(t, up, Rules{Names: []string{"a.test"}}, Options{Rate: 1, Burst: 3})

	// Two questions: a format error, and nothing asked upstream.
	m := new(dns.Msg)
	m.SetQuestion("a.test.", dns.TypeA)
	m.Question = append(m.Question, dns.Question{Name: "b.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	if r, _, err := c.Exchange(m, srv); err != nil || r.Rcode != dns.RcodeFormatError {
		t.Errorf("two questions: %v %v", r, err)
	}
	// Over the rate, UDP queries go unanswered.
	c = &dns.Client{Net: "udp", Timeout: 300 * time.Millisecond}
	lost := 0
	for range 10 {
		m := new(dns.Msg)
		m.SetQuestion("a.test.", dns.TypeA)
		if _, _, err := c.Exchange(m, srv); err != nil {
			lost++
		}
	}
	if lost < 5 {
		t.Errorf("over the rate limit %d of 10 queries went unanswered, want most", lost)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.queries > 4 {
		t.Errorf("upstream asked %d times, want at most the burst", up.queries)
	}
}
