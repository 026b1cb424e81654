package main

import (
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/internal/netpol"
)

func TestParseNetworkFlag(t *testing.T) {
	for _, tc := range []struct {
		in    string
		want  netpol.Policy
		isErr bool
	}{
		{in: "none", want: netpol.Policy{Mode: netpol.ModeNone}},
		{in: "egress", want: netpol.Policy{Mode: netpol.ModeEgress}},
		{in: "allow=1.2.3.4, 10.0.0.0/8,example.com", want: netpol.Policy{Mode: netpol.ModeAllow, Allow: []string{"1.2.3.4", "10.0.0.0/8", "example.com"}}},
		{in: `{"allow":["example.com"]}`, want: netpol.Policy{Mode: netpol.ModeAllow, Allow: []string{"example.com"}}},
		{in: `"egress"`, want: netpol.Policy{Mode: netpol.ModeEgress}},
		{in: "allow=", isErr: true},
		{in: "allow=not an address!", isErr: true},
		{in: "everything", isErr: true},
		{in: `{"allow":"x"}`, isErr: true},
	} {
		got, err := parseNetworkFlag(tc.in)
		if tc.isErr {
			if err == nil {
				t.Errorf("%q: accepted as %+v", tc.in, got)
			}
			continue
		}
		if err != nil || got.Mode != tc.want.Mode || !slices.Equal(got.Allow, tc.want.Allow) {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
