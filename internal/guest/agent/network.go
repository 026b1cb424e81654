package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"connectrpc.com/connect"
	"github.com/vishvananda/netlink"

	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
)

// maxNameservers is what resolv.conf honours (glibc's MAXNS).
const maxNameservers = 3

// netConfig is a validated ConfigureNetworkRequest.
type netConfig struct {
	mac         net.HardwareAddr // nil: keep
	addr        netip.Prefix     // invalid: no network
	gateway     netip.Addr
	nameservers []netip.Addr
	mtu         int // 0: keep
}

// parseNetConfig checks a request from the host: it is trusted more than
// what comes from the guest, but a malformed one must fail whole, before
// anything changes.
func parseNetConfig(req *agentv1.ConfigureNetworkRequest) (netConfig, error) {
	var c netConfig
	if s := req.GetMac(); s != "" {
		mac, err := net.ParseMAC(s)
		if err != nil || len(mac) != 6 {
			return c, fmt.Errorf("bad mac %q", s)
		}
		if mac[0]&1 != 0 {
			return c, fmt.Errorf("mac %s is a multicast address", s)
		}
		c.mac = mac
	}
	if m := req.GetMtu(); m != 0 {
		if m < 576 || m > 65535 {
			return c, fmt.Errorf("mtu %d out of range", m)
		}
		c.mtu = int(m)
	}
	if req.GetAddress() == "" {
		return c, nil
	}
	p, err := netip.ParsePrefix(req.GetAddress())
	if err != nil || !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 30 {
		return c, fmt.Errorf("bad address %q: want an IPv4 address with a prefix length of 8 to 30", req.GetAddress())
	}
	gw, err := netip.ParseAddr(req.GetGateway())
	if err != nil || !p.Masked().Contains(gw) || gw == p.Addr() {
		return c, fmt.Errorf("bad gateway %q for address %s", req.GetGateway(), p)
	}
	if len(req.GetNameservers()) > maxNameservers {
		return c, fmt.Errorf("%d nameservers, at most %d", len(req.GetNameservers()), maxNameservers)
	}
	for _, s := range req.GetNameservers() {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return c, fmt.Errorf("bad nameserver %q", s)
		}
		c.nameservers = append(c.nameservers, a)
	}
	c.addr, c.gateway = p, gw
	return c, nil
}

// resolvConf is the resolv.conf naming servers.
func resolvConf(servers []netip.Addr) []byte {
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	b.WriteString("options timeout:2 attempts:2\n")
	return []byte(b.String())
}

// configureNetwork applies c to Options.NetLink and Options.ResolvConf,
// changing only what differs: the link goes down (which also forgets its
// neighbours, the gateway's hardware address among them) only when its
// hardware address or IPv4 address changes, so connections survive a
// repeat with the same values (a resumed sandbox).
func (a *Agent) configureNetwork(c netConfig) error {
	link, err := netlink.LinkByName(a.opts.NetLink)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) && !c.addr.IsValid() {
			return nil // a VM made without a link: nothing to take down
		}
		return fmt.Errorf("find link %s: %w", a.opts.NetLink, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", a.opts.NetLink, err)
	}
	var stale []netlink.Addr
	have := false
	for _, ad := range addrs {
		p, ok := netip.AddrFromSlice(ad.IP)
		ones, _ := ad.Mask.Size()
		if ok && c.addr.IsValid() && netip.PrefixFrom(p.Unmap(), ones) == c.addr {
			have = true
			continue
		}
		stale = append(stale, ad)
	}
	newMAC := c.mac != nil && !bytes.Equal(link.Attrs().HardwareAddr, c.mac)
	if !c.addr.IsValid() {
		for _, ad := range stale {
			_ = netlink.AddrDel(link, &ad)
		}
		if err := netlink.LinkSetDown(link); err != nil {
			return fmt.Errorf("take %s down: %w", a.opts.NetLink, err)
		}
		return nil
	}
	if newMAC || len(stale) > 0 || !have {
		if err := netlink.LinkSetDown(link); err != nil {
			return fmt.Errorf("take %s down: %w", a.opts.NetLink, err)
		}
	}
	if newMAC {
		if err := netlink.LinkSetHardwareAddr(link, c.mac); err != nil {
			return fmt.Errorf("set %s's hardware address: %w", a.opts.NetLink, err)
		}
	}
	if c.mtu != 0 && link.Attrs().MTU != c.mtu {
		if err := netlink.LinkSetMTU(link, c.mtu); err != nil {
			return fmt.Errorf("set %s's mtu: %w", a.opts.NetLink, err)
		}
	}
	for _, ad := range stale {
		if err := netlink.AddrDel(link, &ad); err != nil {
			return fmt.Errorf("remove address %s: %w", ad.IPNet, err)
		}
	}
	// Only IPv4 is routed to sandboxes; IPv6 would only send solicitations
	// the host drops.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+a.opts.NetLink+"/disable_ipv6", []byte("1"), 0o644)
	if !have {
		ipn := &net.IPNet{IP: c.addr.Addr().AsSlice(), Mask: net.CIDRMask(c.addr.Bits(), 32)}
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("add address %s: %w", c.addr, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("bring %s up: %w", a.opts.NetLink, err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: c.gateway.AsSlice()}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("default route via %s: %w", c.gateway, err)
	}
	if a.opts.ResolvConf != "" && len(c.nameservers) > 0 {
		// Written in place: the file is a bind mount (vm-init's), which a
		// rename would not replace.
		if err := os.WriteFile(a.opts.ResolvConf, resolvConf(c.nameservers), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", a.opts.ResolvConf, err)
		}
	}
	return nil
}

func (s agentService) ConfigureNetwork(_ context.Context, req *connect.Request[agentv1.ConfigureNetworkRequest]) (*connect.Response[agentv1.ConfigureNetworkResponse], error) {
	if s.a.opts.NetLink == "" {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this agent does not own the sandbox's network"))
	}
	c, err := parseNetConfig(req.Msg)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	s.a.netMu.Lock()
	defer s.a.netMu.Unlock()
	if err := s.a.configureNetwork(c); err != nil {
		s.a.log.Warn("configure network", "err", err)
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&agentv1.ConfigureNetworkResponse{}), nil
}
