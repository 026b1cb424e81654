package netpol

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

func TestPolicyJSON(t *testing.T) {
	tests := []struct {
		in      string
		want    Policy
		wantErr bool
		out     string
	}{
		{in: `"none"`, want: Policy{Mode: ModeNone}, out: `"none"`},
		{in: `"egress"`, want: Policy{Mode: ModeEgress}, out: `"egress"`},
		{in: `{"allow": ["10.1.2.0/24", "1.2.3.4", "pypi.org", "Example.COM."]}`,
			want: Policy{Mode: ModeAllow, Allow: []string{"10.1.2.0/24", "1.2.3.4", "pypi.org", "Example.COM."}},
			out:  `{"allow":["10.1.2.0/24","1.2.3.4","pypi.org","Example.COM."]}`},
		{in: `"allow"`, wantErr: true},
		{in: `"everything"`, wantErr: true},
		{in: `{"allow": []}`, wantErr: true},
		{in: `{}`, wantErr: true},
		{in: `{"allow": ["x"], "deny": ["y"]}`, wantErr: true},
		{in: `{"allow": ["2001:db8::/32"]}`, wantErr: true},
		{in: `{"allow": ["10.0.0"]}`, wantErr: true},
		{in: `{"allow": ["localhost"]}`, wantErr: true},
		{in: `{"allow": ["-bad.example"]}`, wantErr: true},
		{in: `{"allow": ["10.0.0.0/33"]}`, wantErr: true},
		{in: `42`, wantErr: true},
		{in: `null`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var p Policy
			err := json.Unmarshal([]byte(tt.in), &p)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Unmarshal(%s) = %+v, want an error", tt.in, p)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, tt.want) {
				t.Fatalf("Unmarshal(%s) = %+v, want %+v", tt.in, p, tt.want)
			}
			b, err := json.Marshal(p)
			if err != nil || string(b) != tt.out {
				t.Fatalf("Marshal = %s, %v; want %s", b, err, tt.out)
			}
		})
	}
}

func TestParseAllow(t *testing.T) {
	tests := []struct {
		in   string
		pfx  string
		host string
	}{
		{"10.1.2.3/16", "10.1.0.0/16", ""},
		{"8.8.8.8", "8.8.8.8/32", ""},
		{"API.Example.com.", "invalid Prefix", "api.example.com"},
		{"*.CDN.example.com", "invalid Prefix", "*.cdn.example.com"},
	}
	for _, tt := range tests {
		p, h, err := parseAllow(tt.in)
		if err != nil || p.String() != tt.pfx || h != tt.host {
			t.Errorf("parseAllow(%q) = %v, %q, %v; want %s, %q", tt.in, p, h, err, tt.pfx, tt.host)
		}
	}
}

func TestParseAllowRejects(t *testing.T) {
	for _, in := range []string{"*", "*.", "*.com", "**.example.com", "a.*.example.com", "*example.com", "10.0.0"} {
		if _, h, err := parseAllow(in); err == nil {
			t.Errorf("parseAllow(%q) = %q, want an error", in, h)
		}
	}
}

func TestHostNameservers(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("# local\nnameserver 127.0.0.53\nnameserver 10.0.0.2\nnameserver ::1\nsearch example.test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := hostNameservers(p)
	if err != nil {
		t.Fatal(err)
	}
	// The local one too: sandboxes' resolvers ask from the host.
	if want := []netip.Addr{netip.MustParseAddr("127.0.0.53"), netip.MustParseAddr("10.0.0.2")}; !slices.Equal(got, want) {
		t.Errorf("hostNameservers = %v, want %v", got, want)
	}
}
