package fetch

import (
	"errors"
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	cases := []struct {
		ip   string
		want Class
	}{
		{"8.8.8.8", Public},
		{"1.1.1.1", Public},
		{"2606:4700:4700::1111", Public},
		{"10.1.2.3", Private},
		{"172.16.0.1", Private},
		{"172.31.255.255", Private},
		{"172.32.0.1", Public},
		{"192.168.1.1", Private},
		{"fc00::1", Private},
		{"fd12:3456::1", Private},
		{"127.0.0.1", Loopback},
		{"127.255.0.1", Loopback},
		{"::1", Loopback},
		{"169.254.1.1", LinkLocal},
		{"fe80::1", LinkLocal},
		{"fe80::1%eth0", LinkLocal},
		{"100.64.0.1", SharedCGNAT},
		{"100.127.255.254", SharedCGNAT},
		{"100.128.0.1", Public},
		{"0.0.0.0", Unspecified},
		{"0.1.2.3", Unspecified},
		{"::", Unspecified},
		{"224.0.0.1", Multicast},
		{"239.255.255.250", Multicast},
		{"ff02::1", Multicast},
		{"169.254.169.254", Metadata},
		{"169.254.170.2", Metadata},
		{"fd00:ec2::254", Metadata},
		{"100.100.100.200", Metadata},
		{"168.63.129.16", Metadata},
		{"255.255.255.255", Reserved},
		{"240.0.0.1", Reserved},
		{"192.0.2.1", Reserved},
		{"198.18.0.1", Reserved},
		{"2001:db8::1", Reserved},
		{"fec0::1", Reserved},
		{"2001:0:4136:e378::1", Reserved}, // Teredo
		{"::127.0.0.1", Reserved},         // IPv4-compatible
		// IPv4 in IPv6 clothing is judged as the IPv4 address it carries.
		{"::ffff:127.0.0.1", Loopback},
		{"::ffff:169.254.169.254", Metadata},
		{"::ffff:10.0.0.1", Private},
		{"::ffff:8.8.8.8", Public},
		{"64:ff9b::7f00:1", Loopback},        // NAT64 of 127.0.0.1
		{"64:ff9b::a9fe:a9fe", Metadata},     // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", Public},         // NAT64 of 8.8.8.8
		{"2002:c0a8:0101::1", Private},       // 6to4 of 192.168.1.1
		{"2002:0808:0808::1", Public},        // 6to4 of 8.8.8.8
		{"2002:a9fe:a9fe::1", Metadata},      // 6to4 of 169.254.169.254
		{"64:ff9b:1::a00:1", Reserved},       // local-use NAT64
		{"2a00:1450:4001:81b::200e", Public}, // an ordinary global address
		{"3fff::1", Reserved},                // documentation (RFC 9637)
		{"100::1", Reserved},                 // discard-only
		{"::ffff:0:a00:1", Reserved},         // IPv4-translated
		{"2001:10::1", Reserved},             // ORCHID
		{"5f00::1", Reserved},                // SRv6 SIDs
		{"192.0.0.8", Reserved},              // IETF protocol assignments
		{"203.0.113.9", Reserved},            // TEST-NET-3
		{"198.51.100.7", Reserved},           // TEST-NET-2
		{"11.0.0.1", Public},                 // just outside 10/8
		{"192.169.0.1", Public},              // just outside 192.168/16
		{"169.253.255.255", Public},          // just outside 169.254/16
		{"fbff:ffff:ffff:ffff::1", Reserved}, // outside 2000::/3
		{"fe00::1", Reserved},                // between fc00::/7 and fe80::/10
		{"4000::1", Reserved},                // unassigned
		{"febf:ffff:ffff:ffff:ffff::1", LinkLocal},
	}
	for _, tc := range cases {
		t.Run(tc.ip, func(t *testing.T) {
			if got := Classify(netip.MustParseAddr(tc.ip)); got != tc.want {
				t.Fatalf("Classify(%s) = %s, want %s", tc.ip, got, tc.want)
			}
		})
	}
	if got := Classify(netip.Addr{}); got != Invalid {
		t.Fatalf("Classify(zero) = %s", got)
	}
}

func TestPolicyCheck(t *testing.T) {
	allow := []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32"), netip.MustParsePrefix("169.254.0.0/16")}
	cases := []struct {
		ip      string
		policy  Policy
		allowed bool
	}{
		{"8.8.8.8", Policy{}, true},
		{"127.0.0.1", Policy{}, false},
		{"127.0.0.1", Policy{AllowPrivate: true}, true},
		{"::1", Policy{AllowPrivate: true}, true},
		{"10.0.0.1", Policy{}, false},
		{"10.0.0.1", Policy{AllowPrivate: true}, true},
		{"100.64.1.1", Policy{AllowPrivate: true}, true},
		{"169.254.10.10", Policy{AllowPrivate: true}, true},
		// Metadata, unspecified, multicast and reserved stay refused.
		{"169.254.169.254", Policy{AllowPrivate: true}, false},
		{"fd00:ec2::254", Policy{AllowPrivate: true}, false},
		{"0.0.0.0", Policy{AllowPrivate: true}, false},
		{"224.0.0.1", Policy{AllowPrivate: true}, false},
		{"255.255.255.255", Policy{AllowPrivate: true}, false},
		// An allow-list opens single prefixes, never metadata.
		{"127.0.0.2", Policy{Allow: allow}, true},
		{"::ffff:127.0.0.2", Policy{Allow: allow}, true},
		{"127.0.0.1", Policy{Allow: allow}, false},
		{"169.254.169.254", Policy{Allow: allow}, false},
	}
	for _, tc := range cases {
		t.Run(tc.ip, func(t *testing.T) {
			err := tc.policy.Check(netip.MustParseAddr(tc.ip))
			if (err == nil) != tc.allowed {
				t.Fatalf("Check(%s) with %+v = %v, want allowed=%v", tc.ip, tc.policy, err, tc.allowed)
			}
			if err != nil && !errors.Is(err, ErrAddressNotAllowed) {
				t.Fatalf("error %v does not wrap ErrAddressNotAllowed", err)
			}
		})
	}
}
