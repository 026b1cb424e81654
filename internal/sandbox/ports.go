package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/internal/store"
)

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// The guest's /proc/net/tcp comes through its agent, which guest root can
// replace: read at most maxTCPTable bytes of each table (a real one lists
// every socket in ≈ 150 bytes, so this is tens of thousands of sockets)
// and accept only real port numbers.
const (
	maxTCPTable = 8 << 20
	maxTCPLine  = 4096
)

// ports lists the TCP ports something listens on
// inside the sandbox, read from the guest's /proc/net/tcp and tcp6.
func (m *Manager) ports(ctx context.Context, sb store.Sandbox) ([]int, error) {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return nil, err
	}
	var ports []int
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		rc, err := rsb.ReadFile(ctx, f)
		if err != nil {
			continue // no IPv6, say
		}
		p, err := listeningPorts(io.LimitReader(rc, maxTCPTable))
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("read %s of %s: %w", f, sb.ID, err)
		}
		ports = append(ports, p...)
	}
	slices.Sort(ports)
	return slices.Compact(ports), nil
}

// listeningPorts parses /proc/net/tcp: "sl local_address rem_address st ...",
// addresses as HEXIP:HEXPORT. Ports are 1..65535, each listed once.
func listeningPorts(r io.Reader) ([]int, error) {
	var ports []int
	seen := map[uint64]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 512), maxTCPLine)
	for first := true; sc.Scan(); first = false {
		f := strings.Fields(sc.Text())
		if first || len(f) < 4 || f[3] != tcpListen {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("port %.16q: not in 1..65535", hexPort)
		}
		if !seen[p] {
			seen[p] = true
			ports = append(ports, int(p))
		}
	}
	return ports, sc.Err()
}
