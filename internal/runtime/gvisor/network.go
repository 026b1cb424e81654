package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

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
