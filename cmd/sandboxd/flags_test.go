package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/netpol"
)

// TestTypedFlagsFailFast checks that a bad network value stops at parse
// time, given on the command line or in the environment, with an error
// that names the flag (and the variable).
func TestTypedFlagsFailFast(t *testing.T) {
	for _, tc := range []struct{ flag, bad, why string }{
		{"network-default", "allow", `want "none" or "egress"`},
		{"network-default", "everything", `want "none" or "egress"`},
		{"network-pool", "10.200.0/16", "ParsePrefix"},
		{"network-pool", "10.200.0.0", "ParsePrefix"},
		{"network-dns", "10.0.0.53,resolver", "ParseAddr"},
		{"network-dns", "10.0.0.0/8", "ParseAddr"},
		{"network-allow-private", "10.1.0.0/16,10.2.0.0", "ParsePrefix"},
		{"network-allow-private", `"10.1.0.0/16`, "comma-separated"},
	} {
		t.Run(tc.flag+"="+tc.bad, func(t *testing.T) {
			err := newServeCmd(&globals{}).Flags().Parse([]string{"--" + tc.flag, tc.bad})
			if err == nil || !strings.Contains(err.Error(), `"--`+tc.flag+`"`) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("--%s %s: %v, want an error naming the flag and saying %s", tc.flag, tc.bad, err, tc.why)
			}
			env := envName(tc.flag)
			lookup := func(k string) (string, bool) { return tc.bad, k == env }
			err = applyEnv(newServeCmd(&globals{}).Flags(), lookup)
			if err == nil || !strings.Contains(err.Error(), env+"=") || !strings.Contains(err.Error(), "(for --"+tc.flag+")") || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("%s=%s: %v, want an error naming the variable and the flag and saying %s", env, tc.bad, err, tc.why)
			}
		})
	}
}

// TestTypedFlagValues checks the parsed values and the defaults: the pool's
// is netpol's, the lists' is none (nil DNS means the host's resolvers), and
// a list flag given twice adds, as pflag's string slices do.
func TestTypedFlagValues(t *testing.T) {
	cmd := newServeCmd(&globals{})
	f := cmd.Flags()
	// The variables serve reads, reached through the flags' values.
	network := f.Lookup("network-default").Value.(policyValue).p
	pool := f.Lookup("network-pool").Value.(prefixValue).p
	dns := f.Lookup("network-dns").Value.(*listValue[netip.Addr]).list
	private := f.Lookup("network-allow-private").Value.(*listValue[netip.Prefix]).list
	if network.Mode != netpol.ModeNone || *pool != netpol.DefaultPool || *dns != nil || *private != nil {
		t.Fatalf("defaults: %+v %v %v %v", *network, *pool, *dns, *private)
	}
	if err := f.Parse([]string{
		"--network-default", "egress", "--network-pool", "10.9.0.0/20",
		"--network-dns", "10.0.0.53,10.0.0.54", "--network-dns", "10.0.0.55",
		"--network-allow-private", "192.168.7.0/24",
	}); err != nil {
		t.Fatal(err)
	}
	if network.Mode != netpol.ModeEgress {
		t.Errorf("network = %+v, want egress", *network)
	}
	if want := netip.MustParsePrefix("10.9.0.0/20"); *pool != want {
		t.Errorf("pool = %v, want %v", *pool, want)
	}
	wantDNS := []netip.Addr{netip.MustParseAddr("10.0.0.53"), netip.MustParseAddr("10.0.0.54"), netip.MustParseAddr("10.0.0.55")}
	if !slices.Equal(*dns, wantDNS) {
		t.Errorf("dns = %v, want %v", *dns, wantDNS)
	}
	if want := []netip.Prefix{netip.MustParsePrefix("192.168.7.0/24")}; !slices.Equal(*private, want) {
		t.Errorf("private = %v, want %v", *private, want)
	}
	if got := f.Lookup("network-dns").Value.String(); got != "[10.0.0.53,10.0.0.54,10.0.0.55]" {
		t.Errorf("--network-dns prints %q", got)
	}
}
