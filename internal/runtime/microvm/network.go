package microvm

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// A sandbox network reaches a VM the way Kata Containers' default does it:
// netpol makes the namespace with its veth end eth0 (addressed, routed, and
// policed from the host's side), and here a tap device joins it, with two
// traffic-control redirects: everything arriving on eth0 leaves through the
// tap to the VM, everything the VM sends leaves through eth0. The guest's
// virtio-net link then takes eth0's place: its address, its hardware
// address and its gateway, which the agent sets (ConfigureNetwork). The
// namespace's own stack sees none of the traffic.
//
// QEMU does not join the namespace: sandboxd opens the tap there and hands
// QEMU the descriptor, so QEMU stays in its empty network namespace of its
// own, without /dev/net/tun in its jail or any privilege over links. The
// tap is not persistent: it goes when QEMU does (a pause, a stop), and the
// next boot makes a new one. Every VM has the NIC, the ones without a
// network too (its backend then is a hub port with nothing else on it,
// which QEMU notes as "hub 0 is not connected to host network"),
// because a memory snapshot restores only into the devices it was saved
// with: one template serves sandboxes with and without networks.
const (
	// tapName is the tap's name in the sandbox's namespace.
	tapName = "tap0"
	// nsLink is netpol's end of the veth pair in the namespace.
	nsLink = "eth0"
	// unwiredMAC is the NIC's hardware address in a VM without a network
	// (and in templates, until a restore configures the link).
	unwiredMAC = "02:00:00:00:00:01"
)

// tap is a VM's NIC backend in the sandbox's namespace.
type tap struct {
	file *os.File // the tap queue QEMU gets
	mac  string   // eth0's hardware address: the guest's from now on
	mtu  int
}

// plugTap creates the tap in n's namespace and wires it to eth0. A tap
// left from an earlier boot of the sandbox is replaced.
func plugTap(n *runtime.Network) (*tap, error) {
	ns, err := netns.GetFromPath(n.Netns)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	defer h.Close()
	eth, err := h.LinkByName(nsLink)
	if err != nil {
		return nil, fmt.Errorf("find %s in the sandbox's namespace: %w", nsLink, err)
	}
	if old, err := h.LinkByName(tapName); err == nil {
		if err := h.LinkDel(old); err != nil {
			return nil, fmt.Errorf("remove an earlier %s: %w", tapName, err)
		}
	}
	f, err := openTap(ns, tapName)
	if err != nil {
		return nil, err
	}
	t := &tap{file: f, mac: eth.Attrs().HardwareAddr.String(), mtu: eth.Attrs().MTU}
	if err := wireTap(h, eth); err != nil {
		f.Close()
		return nil, err
	}
	if err := waitTapUp(h, 3*time.Second); err != nil {
		f.Close()
		return nil, err
	}
	return t, nil
}

// wireTap brings the tap up and redirects each link's ingress to the
// other's egress. Replacing eth0's ingress qdisc drops the filters that
// pointed at an earlier tap.
func wireTap(h *netlink.Handle, eth netlink.Link) error {
	tl, err := h.LinkByName(tapName)
	if err != nil {
		return fmt.Errorf("find %s: %w", tapName, err)
	}
	if err := h.LinkSetMTU(tl, eth.Attrs().MTU); err != nil {
		return fmt.Errorf("set %s's mtu: %w", tapName, err)
	}
	if err := h.LinkSetUp(tl); err != nil {
		return fmt.Errorf("bring %s up: %w", tapName, err)
	}
	for _, p := range [][2]netlink.Link{{eth, tl}, {tl, eth}} {
		from, to := p[0].Attrs(), p[1].Attrs()
		ingress := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: from.Index, Parent: netlink.HANDLE_INGRESS, Handle: netlink.MakeHandle(0xffff, 0)}}
		if err := h.QdiscDel(ingress); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("remove %s's ingress qdisc: %w", from.Name, err)
		}
		if err := h.QdiscAdd(ingress); err != nil {
			return fmt.Errorf("add %s's ingress qdisc: %w", from.Name, err)
		}
		// u32 with no selector matches every frame (matchall is not in
		// every kernel); the mirred action steals it for the other link.
		redirect := &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: from.Index, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: unix.ETH_P_ALL},
			Actions:     []netlink.Action{netlink.NewMirredAction(to.Index)},
		}
		if err := h.FilterAdd(redirect); err != nil {
			return fmt.Errorf("redirect %s to %s: %w", from.Name, to.Name, err)
		}
	}
	return nil
}

// openTap creates the tap name in ns and returns its queue. TUNSETIFF makes
// the device in the calling thread's namespace, so it runs on a locked
// thread that is thrown away afterwards (the goroutine ends without
// unlocking), never on one other goroutines may run on.
func openTap(ns netns.NsHandle, name string) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			ch <- result{err: fmt.Errorf("enter network namespace: %w", err)}
			return
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			ch <- result{err: fmt.Errorf("open /dev/net/tun: %w", err)}
			return
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			ch <- result{err: err}
			return
		}
		// No packet-information header and no virtio-net header: a tap
		// without offloads is what every VM's NIC was made against, the
		// templates' included (a restore needs the same peer features).
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(ifr))); errno != 0 {
			unix.Close(fd)
			ch <- result{err: fmt.Errorf("create tap %s: %w", name, errno)}
			return
		}
		// No IPv6 on the tap: it would only solicit the guest's routers.
		_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
		ch <- result{f: os.NewFile(uintptr(fd), "tap")}
	}()
	r := <-ch
	return r.f, r.err
}

// waitTapUp waits until the tap is operationally up. Its queue (the
// descriptor QEMU gets) is attached from the start, but the kernel marks
// a link up asynchronously after it is set up, and drops what is sent to
// it until then: the guest's first packets with it.
func waitTapUp(h *netlink.Handle, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		l, err := h.LinkByName(tapName)
		if err != nil {
			return fmt.Errorf("find %s: %w", tapName, err)
		}
		if st := l.Attrs().OperState; st == netlink.OperUp || st == netlink.OperUnknown {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not come up (%s)", tapName, l.Attrs().OperState)
		}
		time.Sleep(time.Millisecond)
	}
}

// netConfig is what the guest's link is to be: n's address, gateway and
// nameservers with eth0's hardware address and MTU, or, without a network
// (or a tap), down.
func netConfig(n *runtime.Network, t *tap) guest.NetConfig {
	if n == nil || t == nil {
		return guest.NetConfig{}
	}
	c := guest.NetConfig{MAC: t.mac, MTU: t.mtu, Address: n.Address, Gateway: n.Gateway, Nameservers: n.Nameservers}
	if len(c.Nameservers) > 3 {
		c.Nameservers = c.Nameservers[:3]
	}
	return c
}

// checkNetwork refuses a network the guest could not be given.
func checkNetwork(n *runtime.Network) error {
	if n == nil {
		return nil
	}
	if n.Netns == "" {
		return errors.New("network: no namespace path")
	}
	if !n.Address.IsValid() || !n.Address.Addr().Is4() || !n.Gateway.IsValid() {
		return fmt.Errorf("network: the guest needs an IPv4 address and a gateway (have %v, %v)", n.Address, n.Gateway)
	}
	if _, err := os.Stat(n.Netns); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	return nil
}
