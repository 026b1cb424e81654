package fetch

import (
	"errors"
	"fmt"
	"net/netip"
)

// Class is what kind of network an address belongs to, as far as deciding
// whether the server may connect to it on a user's behalf.
type Class string

// The address classes. Public is the only class allowed by default;
// Private, Loopback, LinkLocal and SharedCGNAT are allowed with
// Options.AllowPrivate; the rest are never allowed.
const (
	Public      Class = "public"
	Private     Class = "private"      // RFC 1918, IPv6 unique local fc00::/7
	Loopback    Class = "loopback"     // 127.0.0.0/8, ::1
	LinkLocal   Class = "link-local"   // 169.254.0.0/16, fe80::/10
	SharedCGNAT Class = "shared-cgnat" // 100.64.0.0/10 (RFC 6598)
	Unspecified Class = "unspecified"  // 0.0.0.0/8, ::
	Multicast   Class = "multicast"    // 224.0.0.0/4, ff00::/8
	Metadata    Class = "metadata"     // cloud instance metadata services
	Reserved    Class = "reserved"     // broadcast, future use, documentation, benchmarking, ...
	Invalid     Class = "invalid"      // the zero Addr
)

// metadataAddrs are the instance metadata endpoints of the common clouds.
// They hand out credentials to anything on the machine that asks, so they
// are refused even when private downloads are allowed.
var metadataAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("169.254.169.254"): true, // AWS, GCP, Azure, OpenStack, ...
	netip.MustParseAddr("169.254.170.2"):   true, // AWS ECS task metadata
	netip.MustParseAddr("169.254.169.253"): true, // AWS DNS resolver
	netip.MustParseAddr("168.63.129.16"):   true, // Azure wire server
	netip.MustParseAddr("100.100.100.200"): true, // Alibaba Cloud
	netip.MustParseAddr("fd00:ec2::254"):   true, // AWS over IPv6
	netip.MustParseAddr("fd00:ec2::23"):    true, // AWS DNS over IPv6
}

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

var (
	privatePrefixes  = mustPrefixes("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
	cgnatPrefix      = netip.MustParsePrefix("100.64.0.0/10")
	unspecPrefixes   = mustPrefixes("0.0.0.0/8")
	reservedPrefixes = mustPrefixes(
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // TEST-NET-1
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // TEST-NET-2
		"203.0.113.0/24",  // TEST-NET-3
		"240.0.0.0/4",     // future use and the limited broadcast address
		"::/96",           // deprecated IPv4-compatible addresses
		"100::/64",        // discard-only
		"2001:db8::/32",   // documentation
		"fec0::/10",       // deprecated site-local
		"2001:10::/28",    // ORCHID
		"3fff::/20",       // documentation (RFC 9637)
		"5f00::/16",       // segment routing SIDs
		"2001::/32",       // Teredo: tunnels to an embedded IPv4 address
		"64:ff9b:1::/48",  // local-use NAT64
		"::ffff:0:0:0/96", // IPv4-translated (SIIT)
		"::/8",            // the rest of the reserved ::/8 block
	)
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
	nat64Prefix    = netip.MustParsePrefix("64:ff9b::/96")
	sixToFourPref  = netip.MustParsePrefix("2002::/16")
)

// Classify tells which network ip belongs to. IPv4-mapped IPv6 addresses
// are classified as the IPv4 address they carry, and the translation
// prefixes (NAT64 64:ff9b::/96, 6to4 2002::/16) as the IPv4 address they
// embed, so that neither can smuggle a private address past the check.
func Classify(ip netip.Addr) Class {
	if !ip.IsValid() {
		return Invalid
	}
	ip = ip.WithZone("").Unmap()
	if metadataAddrs[ip] {
		return Metadata
	}
	if v4, ok := embeddedV4(ip); ok {
		return Classify(v4)
	}
	switch {
	case ip.IsUnspecified():
		return Unspecified
	case ip.IsLoopback():
		return Loopback
	case ip.IsMulticast():
		return Multicast
	case ip.IsLinkLocalUnicast():
		return LinkLocal
	case cgnatPrefix.Contains(ip):
		return SharedCGNAT
	}
	for _, p := range unspecPrefixes {
		if p.Contains(ip) {
			return Unspecified
		}
	}
	for _, p := range privatePrefixes {
		if p.Contains(ip) {
			return Private
		}
	}
	for _, p := range reservedPrefixes {
		if p.Contains(ip) {
			return Reserved
		}
	}
	// Only 2000::/3 is allocated for global unicast; the rest of the IPv6
	// space not classified above is unassigned.
	if ip.Is6() && !globalUnicast6.Contains(ip) {
		return Reserved
	}
	return Public
}

// embeddedV4 returns the IPv4 address carried by a NAT64 or 6to4 address.
func embeddedV4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case nat64Prefix.Contains(ip):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case sixToFourPref.Contains(ip):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// ErrAddressNotAllowed is wrapped by every refusal to connect to an address.
var ErrAddressNotAllowed = errors.New("address not allowed")

// AddressError is a refusal to connect to IP.
type AddressError struct {
	IP    netip.Addr
	Class Class
}

func (e *AddressError) Error() string {
	return fmt.Sprintf("address not allowed: %s is %s", e.IP, e.Class)
}

// Unwrap makes errors.Is(err, ErrAddressNotAllowed) hold.
func (e *AddressError) Unwrap() error { return ErrAddressNotAllowed }

// Policy decides which addresses a download may connect to.
type Policy struct {
	// AllowPrivate allows private, loopback, link-local and shared (CGNAT)
	// addresses. Metadata, unspecified, multicast and reserved addresses
	// stay refused.
	AllowPrivate bool
	// Allow lists prefixes allowed whatever their class, except metadata
	// endpoints (e.g. an internal artifact server).
	Allow []netip.Prefix
}

// Check returns nil when ip may be connected to, else an *AddressError.
func (p Policy) Check(ip netip.Addr) error {
	c := Classify(ip)
	switch c {
	case Public:
		return nil
	case Metadata, Invalid:
		return &AddressError{IP: ip, Class: c}
	}
	plain := ip.WithZone("").Unmap()
	for _, pre := range p.Allow {
		if pre.Contains(plain) {
			return nil
		}
	}
	if p.AllowPrivate {
		switch c {
		case Private, Loopback, LinkLocal, SharedCGNAT:
			return nil
		}
	}
	return &AddressError{IP: ip, Class: c}
}
