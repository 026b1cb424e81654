package netpol

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where named namespaces are mounted, as `ip netns` does.
const netnsDir = "/run/netns"

// guestIf is the guest end's name inside the namespace.
const guestIf = "eth0"

// makeLinks creates n's namespace and veth pair, addresses both ends and
// routes the guest's traffic through the host end.
func makeLinks(n *Network) error {
	ns, err := newNamedNetns(filepath.Base(n.Netns))
	if err != nil {
		return fmt.Errorf("create netns: %w", err)
	}
	defer ns.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: n.HostIf},
		PeerName:      guestIf,
		PeerNamespace: netlink.NsFd(int(ns)),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("create veth %s: %w", n.HostIf, err)
	}
	host, err := netlink.LinkByName(n.HostIf)
	if err != nil {
		return fmt.Errorf("find veth %s: %w", n.HostIf, err)
	}
	// The host end has no business with IPv6 (a link-local address would be
	// one more way to reach the host).
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+n.HostIf+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipNet(n.HostAddr, 30)}); err != nil {
		return fmt.Errorf("address %s: %w", n.HostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("bring up %s: %w", n.HostIf, err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in netns: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring up lo in netns: %w", err)
	}
	guest, err := h.LinkByName(guestIf)
	if err != nil {
		return fmt.Errorf("find %s in netns: %w", guestIf, err)
	}
	if err := h.AddrAdd(guest, &netlink.Addr{IPNet: ipNet(n.GuestAddr, 30)}); err != nil {
		return fmt.Errorf("address %s in netns: %w", guestIf, err)
	}
	if err := h.LinkSetUp(guest); err != nil {
		return fmt.Errorf("bring up %s in netns: %w", guestIf, err)
	}
	route := &netlink.Route{LinkIndex: guest.Attrs().Index, Gw: n.HostAddr.AsSlice()}
	if err := h.RouteAdd(route); err != nil {
		return fmt.Errorf("default route in netns: %w", err)
	}
	return waitOperUp(n.HostIf, h)
}

// waitOperUp waits until both ends of the pair are operationally up. The
// kernel activates a link's queueing discipline asynchronously after it
// goes up (link watch, the same step that sets the operational state);
// until then it drops what is sent, so a guest's first packets would be
// lost. It takes a fraction of a millisecond.
func waitOperUp(hostIf string, guestNs *netlink.Handle) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		hl, err := netlink.LinkByName(hostIf)
		if err != nil {
			return fmt.Errorf("find veth %s: %w", hostIf, err)
		}
		gl, err := guestNs.LinkByName(guestIf)
		if err != nil {
			return fmt.Errorf("find %s in netns: %w", guestIf, err)
		}
		if hl.Attrs().OperState == netlink.OperUp && gl.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("veth %s did not come up (host end %s, guest end %s)", hostIf, hl.Attrs().OperState, gl.Attrs().OperState)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

// newNamedNetns creates a namespace mounted at netnsDir/name and returns a
// handle to it. Creating one switches the calling thread into it, so that
// happens on a locked thread that is thrown away afterwards (the goroutine
// ends without unlocking), never on one other goroutines may run on.
func newNamedNetns(name string) (netns.NsHandle, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		ns, err := netns.NewNamed(name)
		ch <- result{ns, err}
	}()
	r := <-ch
	return r.ns, r.err
}

// delNetns unmounts and removes a named namespace; gone is fine. A file
// that is not a mount (a crash between creating and mounting) is removed
// too.
func delNetns(name string) error {
	p := filepath.Join(netnsDir, name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return nil
}

// delLink deletes a link of the root namespace (a veth's peer goes with
// it); gone is fine.
func delLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("find link %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// listLinks names the root namespace's links that start with prefix.
func listLinks(prefix string) ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []string
	for _, l := range links {
		if name := l.Attrs().Name; strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out, nil
}

// listNetns names the namespaces in netnsDir that start with prefix.
func listNetns(prefix string) ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
