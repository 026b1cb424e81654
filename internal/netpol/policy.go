package netpol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Mode is a sandbox's network mode.
type Mode string

// Modes.
const (
	// ModeNone: loopback only. Nothing is made on the host.
	ModeNone Mode = "none"
	// ModeEgress: the internet, minus the server-wide deny list.
	ModeEgress Mode = "egress"
	// ModeAllow: only the addresses and domains in Policy.Allow (and DNS
	// to the sandbox's resolver, which answers only those domains), minus
	// the deny list.
	ModeAllow Mode = "allow"
)

// MaxAllow bounds the entries of an allow list, so a policy stays a handful
// of firewall rules.
const MaxAllow = 64

// Policy is what a sandbox may reach. Its JSON form is the API's `network`
// field: "none", "egress", or {"allow": ["cidr, address, domain or *.domain", ...]}.
type Policy struct {
	Mode Mode
	// Allow lists IPv4 CIDRs, IPv4 addresses, domain names and wildcards
	// ("*.example.com": every name below example.com, at any depth, not
	// example.com itself; see dnsguard.Match) (ModeAllow only). Domains
	// are enforced by the sandbox's resolver: see Manager.Setup.
	Allow []string
}

// Validate reports what is wrong with p, in words fit for an API error.
func (p Policy) Validate() error {
	switch p.Mode {
	case ModeNone, ModeEgress:
		if len(p.Allow) > 0 {
			return policyErrorf("allow is only valid with an allow list, not %q", p.Mode)
		}
		return nil
	case ModeAllow:
	default:
		return policyErrorf("unknown mode %q (want \"none\", \"egress\" or {\"allow\": [...]})", p.Mode)
	}
	if len(p.Allow) == 0 {
		return policyErrorf("allow list is empty (use \"none\" for no network)")
	}
	if len(p.Allow) > MaxAllow {
		return policyErrorf("allow list has %d entries, at most %d", len(p.Allow), MaxAllow)
	}
	for _, a := range p.Allow {
		if _, _, err := parseAllow(a); err != nil {
			return policyErrorf("allow %q: %v", a, err)
		}
	}
	return nil
}

// parseAllow reads one allow entry: a prefix (an address is its /32) or,
// when it is neither, a domain name or wildcard, lower case, without a
// trailing dot: the form dnsguard.Match takes.
func parseAllow(s string) (netip.Prefix, string, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, "", errors.New("not a valid CIDR")
		}
		if !p.Addr().Is4() {
			return netip.Prefix{}, "", errors.New("only IPv4 is supported")
		}
		return p.Masked(), "", nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() {
			return netip.Prefix{}, "", errors.New("only IPv4 is supported")
		}
		return netip.PrefixFrom(a, 32), "", nil
	}
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		if !isDomain(rest) {
			return netip.Prefix{}, "", errors.New("a wildcard is \"*.\" and a domain name, like *.example.com")
		}
		return netip.Prefix{}, "*." + strings.ToLower(strings.TrimSuffix(rest, ".")), nil
	}
	if !isDomain(s) {
		return netip.Prefix{}, "", errors.New("not a CIDR, an IPv4 address, a domain name or a wildcard (*.example.com)")
	}
	return netip.Prefix{}, strings.ToLower(strings.TrimSuffix(s, ".")), nil
}

// isDomain checks RFC 1123 host name syntax, with at least two labels so a
// typo of an address ("10.0.0") is not taken for a name.
func isDomain(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	if len(labels) < 2 {
		return false
	}
	allDigits := true
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-':
				allDigits = false
			default:
				return false
			}
		}
	}
	return !allDigits
}

// MarshalJSON writes the API form.
func (p Policy) MarshalJSON() ([]byte, error) {
	if p.Mode == ModeAllow {
		return json.Marshal(struct {
			Allow []string `json:"allow"`
		}{p.Allow})
	}
	if p.Mode == "" {
		return json.Marshal(ModeNone)
	}
	return json.Marshal(p.Mode)
}

// UnmarshalJSON reads the API form and validates it.
func (p *Policy) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	var np Policy
	switch {
	case len(b) > 0 && b[0] == '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		np.Mode = Mode(s)
		if np.Mode == ModeAllow {
			return policyErrorf(`"allow" needs a list: {"allow": [...]}`)
		}
	case len(b) > 0 && b[0] == '{':
		var o struct {
			Allow *[]string `json:"allow"`
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			return policyErrorf("%v", err)
		}
		if o.Allow == nil {
			return policyErrorf(`object form needs "allow"`)
		}
		np = Policy{Mode: ModeAllow, Allow: *o.Allow}
	default:
		return policyErrorf(`want "none", "egress" or {"allow": [...]}`)
	}
	if err := np.Validate(); err != nil {
		return err
	}
	*p = np
	return nil
}

// PolicyError is what is wrong with a policy, in words fit for an API
// error about its field (Msg); Error prefixes the field's name.
type PolicyError struct{ Msg string }

func (e *PolicyError) Error() string { return "network: " + e.Msg }

func policyErrorf(format string, a ...any) error {
	return &PolicyError{Msg: fmt.Sprintf(format, a...)}
}
