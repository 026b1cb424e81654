package gvisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// guestResolvConf is where the sandbox's DNS configuration is mounted.
const guestResolvConf = "/etc/resolv.conf"

// withNetwork points spec at the sandbox's network namespace, when it has
// one, and mounts a resolv.conf (written to resolvPath) naming its
// nameservers. It returns runsc's --network mode: "sandbox" runs gVisor's
// own netstack on the namespace's links (runsc takes over eth0's address
// and routes), "none" leaves only loopback, which is all
// http://sandboxd.internal needs.
func withNetwork(spec *specs.Spec, n *runtime.Network, resolvPath string) (string, error) {
	if n == nil {
		return "none", nil
	}
	if n.Netns == "" {
		return "", fmt.Errorf("network: no namespace path")
	}
	if _, err := os.Stat(n.Netns); err != nil {
		return "", fmt.Errorf("network namespace: %w", err)
	}
	for i := range spec.Linux.Namespaces {
		if spec.Linux.Namespaces[i].Type == specs.NetworkNamespace {
			spec.Linux.Namespaces[i].Path = n.Netns
		}
	}
	var b strings.Builder
	for _, ns := range n.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	b.WriteString("options timeout:2 attempts:2\n")
	if err := os.WriteFile(resolvPath, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("write resolv.conf: %w", err)
	}
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: guestResolvConf, Type: "bind", Source: resolvPath, Options: []string{"rbind", "ro"}})
	return "sandbox", nil
}

// sandboxNetCmd runs runsc with --network=sandbox in a mount namespace of
// its own where /proc/sys/net is hidden under an empty tmpfs.
//
// Why: before it takes over the namespace's links, runsc refuses to run in
// the host's root network namespace, and the runsc Debian ships (2022)
// tells one from another by whether /proc/sys/net/core/rmem_default exists:
// true of the root namespace only on the kernels of its day, of every
// namespace on current ones (6.x), so it refuses all of them. With
// /proc/sys/net hidden the check passes; nothing else runsc does for a
// netstack sandbox reads it. The namespace is a slave of the host's, so
// unmounts on the host (a sandbox's overlay, its disk image) still reach
// it and nothing mounted in it leaks out; it ends with runsc's processes.
// It needs util-linux's unshare and mount (Debian: essential packages).
func sandboxNetCmd(ctx context.Context, runsc string, args []string) *exec.Cmd {
	const script = `mount -t tmpfs -o size=4k,mode=0555 sandboxd-netns-check /proc/sys/net && exec "$0" "$@"`
	return exec.CommandContext(ctx, "unshare", append([]string{"--mount", "--propagation", "slave", "--", "sh", "-c", script, runsc}, args...)...)
}

// guestLink is the guest's link in a sandbox's namespace (package netpol
// makes it).
const guestLink = "eth0"

// readdress gives the guest's link in n's namespace the sandbox's address
// and default route again, before a paused sandbox is restored there.
// runsc --network=sandbox moves them from the link into its netstack when
// the sandbox starts (the host's stack must not answer for the guest), and
// a restored netstack takes the addresses and routes of the namespace it
// is restored in (how a fork's child, in a namespace of its own, gets its
// own): restored in the namespace it left, a sandbox would find none and
// lose its address and routes. A network recorded without its address
// (by an older sandboxd) is left as it is.
func readdress(n *runtime.Network) error {
	if n == nil || !n.Address.IsValid() || !n.Gateway.IsValid() {
		return nil
	}
	ns, err := netns.GetFromPath(n.Netns)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", n.Netns, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", n.Netns, err)
	}
	defer h.Close()
	link, err := h.LinkByName(guestLink)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", guestLink, n.Netns, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: n.Address.Addr().AsSlice(), Mask: net.CIDRMask(n.Address.Bits(), n.Address.Addr().BitLen())}}
	if err := h.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("address %s in %s: %w", guestLink, n.Netns, err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: n.Gateway.AsSlice()}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("default route in %s: %w", n.Netns, err)
	}
	return nil
}
