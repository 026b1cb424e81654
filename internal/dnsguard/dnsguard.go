// Package dnsguard is a sandbox's DNS resolver: a small DNS server that
// sandboxd runs on the sandbox's gateway address, answering only the names
// the sandbox's policy allows and telling the firewall which addresses
// those names resolved to, for as long as the answer is valid.
//
// Why a resolver of its own: resolving an allow list's names once, when a
// sandbox starts, stops working when a name's addresses change (CDNs,
// round robin), and lets through every other name served from the same
// addresses. Answering the sandbox's queries itself, sandboxd learns each
// address at the moment the guest learns it, with the record's TTL, and a
// name not on the list never resolves, whatever address it shares.
//
// Everything that comes from the sandbox is hostile: queries are bounded in
// rate (Options.Rate), in number in flight (Options.MaxInFlight), in size
// (one question, a UDP read buffer of MaxUDPSize), and TCP in connections
// and time.
package dnsguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"
)

// Bounds of the timeout an answer's addresses are allowed for.
const (
	// MinTTL is the shortest time an answered address is allowed for. A
	// record's TTL can be 0 or a few seconds (some load balancers); the
	// guest still has to connect after reading the answer, and a
	// connection's later packets must not find the address gone.
	MinTTL = 5 * time.Minute
	// MaxTTL is the longest: an address a name has moved away from stays
	// allowed at most this long after the last answer that named it. The
	// TTL the guest sees is capped to it too, so the guest never caches
	// an address longer than it is allowed.
	MaxTTL = time.Hour
)

// Defaults for Options' zero fields.
const (
	DefaultRate        = 50  // queries per second, per sandbox
	DefaultBurst       = 200 // queries at once above the rate
	DefaultMaxInFlight = 32  // upstream lookups at once, per sandbox
	DefaultMaxTCPConns = 8   // TCP connections at once, per sandbox
	// MaxUDPSize is the largest UDP query read; anything longer is cut and
	// fails to parse. A query with one question fits in far less.
	MaxUDPSize = 1232
	// upstreamTimeout bounds one upstream exchange.
	upstreamTimeout = 3 * time.Second
)

// Rules are the names a resolver answers.
type Rules struct {
	// Any answers every name (a policy of "egress"), recording nothing:
	// the firewall lets the sandbox reach any address anyway.
	Any bool
	// Names are the allowed names: "example.com" exactly, or
	// "*.example.com", any name below example.com at any depth but not
	// example.com itself. Lower case, no trailing dot (see Match).
	Names []string
}

// Match reports whether name (any case, trailing dot or not) is allowed by
// one of patterns: the one definition of what an allow list's domain entry
// matches.
func Match(patterns []string, name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" {
		return false
	}
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
			continue
		}
		if name == p {
			return true
		}
	}
	return false
}

// Options configure a Server.
type Options struct {
	// Addr is where the server listens, UDP and TCP (the sandbox's
	// gateway address; port 53 unless Port is set).
	Addr netip.Addr
	Port uint16
	// Upstream are the resolvers asked, in order (port 53 unless given).
	Upstream []netip.AddrPort
	// Record is told the IPv4 addresses of an allowed answer and how long
	// to allow them, before the guest gets the answer: when the guest
	// connects the firewall already lets it. An error answers SERVFAIL.
	Record func(addrs []netip.Addr, timeout time.Duration) error
	// Rate and Burst bound the queries per second the sandbox may send;
	// beyond them UDP queries are dropped and TCP ones refused.
	Rate  float64
	Burst int
	// MaxInFlight bounds the upstream lookups at once; beyond it queries
	// are answered SERVFAIL.
	MaxInFlight int
	// MaxTCPConns bounds the TCP connections at once.
	MaxTCPConns int
	Logger      *slog.Logger
}

// Server is one sandbox's resolver. Its methods are safe for concurrent
// use.
type Server struct {
	opts     Options
	log      *slog.Logger
	limit    *rate.Limiter
	inFlight chan struct{}
	client   *dns.Client
	tcp      *dns.Client

	mu    sync.Mutex
	rules Rules

	udp, tcpSrv *dns.Server
	done        chan error
}

// Start listens on opts.Addr, UDP and TCP, and serves until Close.
func Start(opts Options, rules Rules) (*Server, error) {
	if !opts.Addr.IsValid() {
		return nil, errors.New("dnsguard: no listen address")
	}
	if opts.Port == 0 {
		opts.Port = 53
	}
	if opts.Rate == 0 {
		opts.Rate = DefaultRate
	}
	if opts.Burst == 0 {
		opts.Burst = DefaultBurst
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.MaxTCPConns == 0 {
		opts.MaxTCPConns = DefaultMaxTCPConns
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Record == nil {
		opts.Record = func([]netip.Addr, time.Duration) error { return nil }
	}
	s := &Server{
		opts: opts, log: opts.Logger.With("component", "dnsguard", "addr", opts.Addr),
		limit:    rate.NewLimiter(rate.Limit(opts.Rate), opts.Burst),
		inFlight: make(chan struct{}, opts.MaxInFlight),
		client:   &dns.Client{Net: "udp", Timeout: upstreamTimeout, UDPSize: dns.DefaultMsgSize},
		tcp:      &dns.Client{Net: "tcp", Timeout: upstreamTimeout},
		rules:    copyRules(rules),
		done:     make(chan error, 2),
	}
	addr := net.JoinHostPort(opts.Addr.String(), strconv.Itoa(int(opts.Port)))
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		return nil, fmt.Errorf("dnsguard: listen udp %s: %w", addr, err)
	}
	l, err := net.Listen("tcp4", addr)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("dnsguard: listen tcp %s: %w", addr, err)
	}
	h := dns.HandlerFunc(s.serve)
	s.udp = &dns.Server{PacketConn: pc, Handler: h, UDPSize: MaxUDPSize}
	s.tcpSrv = &dns.Server{
		Listener: netutil.LimitListener(l, opts.MaxTCPConns), Handler: h,
		// A connection that sends nothing, or dribbles, is closed: it
		// holds one of the few TCP slots.
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		IdleTimeout:   func() time.Duration { return 10 * time.Second },
		MaxTCPQueries: 64,
	}
	// Start returns once both serve: a Close before that would find a
	// server not started, and leave it serving for ever.
	started := make(chan struct{}, 2)
	for _, srv := range []*dns.Server{s.udp, s.tcpSrv} {
		srv.NotifyStartedFunc = func() { started <- struct{}{} }
		go func() { s.done <- srv.ActivateAndServe() }()
	}
	for range 2 {
		select {
		case <-started:
		case err := <-s.done:
			// One failed to start: stop the other, and say why.
			_ = s.udp.Shutdown()
			_ = s.tcpSrv.Shutdown()
			pc.Close()
			l.Close()
			return nil, fmt.Errorf("dnsguard: serve %s: %w", addr, err)
		}
	}
	return s, nil
}

func copyRules(r Rules) Rules {
	return Rules{Any: r.Any, Names: append([]string(nil), r.Names...)}
}

// SetRules replaces the names the server answers (a policy update). Answers
// given before stay in force in the firewall until their timeouts: the
// caller replaces the firewall's set along with the rules.
func (s *Server) SetRules(r Rules) {
	s.mu.Lock()
	s.rules = copyRules(r)
	s.mu.Unlock()
}

func (s *Server) allowed(name string) (any, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rules.Any {
		return true, true
	}
	return false, Match(s.rules.Names, name)
}

// Close stops the server and waits for its listeners to close.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := errors.Join(s.udp.ShutdownContext(ctx), s.tcpSrv.ShutdownContext(ctx))
	for range 2 {
		if serr := <-s.done; serr != nil {
			err = errors.Join(err, serr)
		}
	}
	if err != nil {
		return fmt.Errorf("dnsguard: close %s: %w", s.opts.Addr, err)
	}
	return nil
}

// serve answers one query.
func (s *Server) serve(w dns.ResponseWriter, req *dns.Msg) {
	_, isTCP := w.RemoteAddr().(*net.TCPAddr)
	if !s.limit.Allow() {
		// Over UDP a dropped query costs nothing; an answer would make
		// the server an amplifier of the guest's flood.
		if isTCP {
			s.reply(w, req, errorMsg(req, dns.RcodeRefused))
		}
		return
	}
	if req.Opcode != dns.OpcodeQuery {
		s.reply(w, req, errorMsg(req, dns.RcodeNotImplemented))
		return
	}
	if len(req.Question) != 1 || req.Question[0].Qclass != dns.ClassINET {
		s.reply(w, req, errorMsg(req, dns.RcodeFormatError))
		return
	}
	q := req.Question[0]
	anyName, ok := s.allowed(q.Name)
	if !ok {
		s.reply(w, req, denied(req))
		return
	}
	switch {
	case q.Qtype == dns.TypeAAAA:
		// The sandbox's network is IPv4 only: no addresses, and no wait
		// for ones it could not reach.
		s.reply(w, req, emptyAnswer(req))
		return
	case q.Qtype != dns.TypeA && !anyName:
		// An allow list lets the guest reach addresses, nothing else: no
		// record type but A is asked upstream for it.
		s.reply(w, req, emptyAnswer(req))
		return
	}
	select {
	case s.inFlight <- struct{}{}:
		defer func() { <-s.inFlight }()
	default:
		s.reply(w, req, errorMsg(req, dns.RcodeServerFailure))
		return
	}
	resp, err := s.exchange(q)
	if err != nil {
		s.log.Debug("upstream lookup failed", "name", q.Name, "err", err)
		s.reply(w, req, errorMsg(req, dns.RcodeServerFailure))
		return
	}
	out := new(dns.Msg)
	out.SetRcode(req, resp.Rcode)
	out.RecursionAvailable = true
	if anyName {
		out.Answer, out.Ns = resp.Answer, resp.Ns
		s.reply(w, req, out)
		return
	}
	// Only the answer's CNAMEs and addresses go back, with TTLs capped at
	// MaxTTL; its addresses are recorded before the guest sees them.
	var addrs []netip.Addr
	minTTL := uint32(MaxTTL / time.Second)
	for _, rr := range resp.Answer {
		switch rr := rr.(type) {
		case *dns.CNAME:
		case *dns.A:
			a, ok := netip.AddrFromSlice(rr.A.To4())
			if !ok {
				continue
			}
			addrs = append(addrs, a)
			minTTL = min(minTTL, rr.Hdr.Ttl)
		default:
			continue
		}
		rr = dns.Copy(rr)
		rr.Header().Ttl = min(rr.Header().Ttl, uint32(MaxTTL/time.Second))
		out.Answer = append(out.Answer, rr)
	}
	if len(addrs) > 0 {
		timeout := max(time.Duration(minTTL)*time.Second, MinTTL)
		if err := s.opts.Record(addrs, timeout); err != nil {
			s.log.Warn("record answered addresses", "name", q.Name, "err", err)
			s.reply(w, req, errorMsg(req, dns.RcodeServerFailure))
			return
		}
	}
	s.reply(w, req, out)
}

// exchange asks the upstream resolvers in turn for q, over TCP when an
// answer came back truncated.
func (s *Server) exchange(q dns.Question) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.Id = dns.Id()
	m.RecursionDesired = true
	m.Question = []dns.Question{q}
	m.SetEdns0(dns.DefaultMsgSize, false)
	var errs []error
	for _, up := range s.opts.Upstream {
		if up.Port() == 0 {
			up = netip.AddrPortFrom(up.Addr(), 53)
		}
		resp, _, err := s.client.Exchange(m, up.String())
		if err == nil && resp.Truncated {
			resp, _, err = s.tcp.Exchange(m, up.String())
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
			errs = append(errs, fmt.Errorf("%s: %s", up, dns.RcodeToString[resp.Rcode]))
			continue
		}
		return resp, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream resolvers")
	}
	return nil, errors.Join(errs...)
}

// reply writes m, cut to what the guest can read over UDP.
func (s *Server) reply(w dns.ResponseWriter, req, m *dns.Msg) {
	if _, isTCP := w.RemoteAddr().(*net.TCPAddr); !isTCP {
		size := dns.MinMsgSize
		if o := req.IsEdns0(); o != nil {
			size = max(int(o.UDPSize()), dns.MinMsgSize)
		}
		m.Truncate(size)
	}
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("write answer", "err", err)
	}
}

func errorMsg(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	return m
}

func emptyAnswer(req *dns.Msg) *dns.Msg { return errorMsg(req, dns.RcodeSuccess) }

// denied answers a name the policy does not allow: NXDOMAIN, not REFUSED.
// For the sandbox the name does not exist, and resolvers say so at once
// ("no such host"); REFUSED makes stub resolvers try the next server and
// report a misbehaving one. An EDNS guest also gets the extended error
// "Prohibited" (RFC 8914) saying why.
func denied(req *dns.Msg) *dns.Msg {
	m := errorMsg(req, dns.RcodeNameError)
	if req.IsEdns0() != nil {
		m.SetEdns0(dns.MinMsgSize, false)
		o := m.IsEdns0()
		o.Option = append(o.Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeProhibited, ExtraText: "not in the sandbox's network policy"})
	}
	return m
}
