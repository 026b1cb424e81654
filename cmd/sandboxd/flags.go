package main

import (
	"encoding/csv"
	"fmt"
	"net/netip"
	"strings"

	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/netpol"
)

// Typed flag values: a value is parsed when the flag (or its SANDBOXD_*
// variable, env.go) is set, so a bad one stops the command before it opens
// anything, with an error naming the flag, instead of deep inside serve.

// policyValue is a flag holding a default network policy. Only the string
// modes fit on a command line ("none", "egress"); an allow list is for
// requests, whose policy comes as JSON.
type policyValue struct{ p *netpol.Policy }

var _ pflag.Value = policyValue{}

func newPolicyValue(p *netpol.Policy, def netpol.Mode) policyValue {
	*p = netpol.Policy{Mode: def}
	return policyValue{p}
}

func (v policyValue) Set(s string) error {
	switch m := netpol.Mode(s); m {
	case netpol.ModeNone, netpol.ModeEgress:
		*v.p = netpol.Policy{Mode: m}
		return nil
	}
	return fmt.Errorf("network %q: want %q or %q (an allow list is given per request)", s, netpol.ModeNone, netpol.ModeEgress)
}

func (v policyValue) String() string {
	if v.p == nil || v.p.Mode == "" {
		return string(netpol.ModeNone)
	}
	return string(v.p.Mode)
}

func (policyValue) Type() string { return "network" }

// prefixValue is a flag holding one CIDR.
type prefixValue struct{ p *netip.Prefix }

var _ pflag.Value = prefixValue{}

func newPrefixValue(p *netip.Prefix, def netip.Prefix) prefixValue {
	*p = def
	return prefixValue{p}
}

func (v prefixValue) Set(s string) error {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return err
	}
	*v.p = p
	return nil
}

func (v prefixValue) String() string {
	if v.p == nil || !v.p.IsValid() {
		return ""
	}
	return v.p.String()
}

func (prefixValue) Type() string { return "cidr" }

// listValue is a flag holding a list of T, written like pflag's string
// slices: comma-separated, repeatable, and the first use replaces the
// default rather than adding to it.
type listValue[T fmt.Stringer] struct {
	list    *[]T
	parse   func(string) (T, error)
	typ     string
	changed bool
}

var _ pflag.SliceValue = (*listValue[netip.Addr])(nil)

func newAddrListValue(l *[]netip.Addr) *listValue[netip.Addr] {
	return &listValue[netip.Addr]{list: l, parse: netip.ParseAddr, typ: "addrs"}
}

func newPrefixListValue(l *[]netip.Prefix) *listValue[netip.Prefix] {
	return &listValue[netip.Prefix]{list: l, parse: netip.ParsePrefix, typ: "cidrs"}
}

func (v *listValue[T]) Set(s string) error {
	fields, err := splitCSV(s)
	if err != nil {
		return err
	}
	items, err := v.parseAll(fields)
	if err != nil {
		return err
	}
	if v.changed {
		*v.list = append(*v.list, items...)
	} else {
		*v.list = items
	}
	v.changed = true
	return nil
}

func (v *listValue[T]) parseAll(fields []string) ([]T, error) {
	items := make([]T, 0, len(fields))
	for _, f := range fields {
		it, err := v.parse(f)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

func (v *listValue[T]) Append(s string) error {
	it, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.list = append(*v.list, it)
	return nil
}

func (v *listValue[T]) Replace(ss []string) error {
	items, err := v.parseAll(ss)
	if err != nil {
		return err
	}
	*v.list = items
	return nil
}

func (v *listValue[T]) GetSlice() []string {
	out := make([]string, len(*v.list))
	for i, it := range *v.list {
		out[i] = it.String()
	}
	return out
}

// String is the list as pflag prints string slices ("[a,b]"), except that
// the empty list is "": pflag then leaves the default out of the help,
// where "(default [])" would contradict the usage's own word on it.
func (v *listValue[T]) String() string {
	if v.list == nil || len(*v.list) == 0 {
		return ""
	}
	return "[" + strings.Join(v.GetSlice(), ",") + "]"
}

func (v *listValue[T]) Type() string { return v.typ }

// splitCSV splits a list flag's value the way pflag's string slices do
// (CSV, so an entry may be quoted); "" is the empty list.
func splitCSV(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	fields, err := csv.NewReader(strings.NewReader(s)).Read()
	if err != nil {
		return nil, fmt.Errorf("not a comma-separated list: %w", err)
	}
	return fields, nil
}
