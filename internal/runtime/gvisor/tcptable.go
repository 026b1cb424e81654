package gvisor

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// TCP sockets as a sandbox's /proc/net/tcp and /proc/net/tcp6 list them,
// for checkSockets: which keep Debian's 2022 runsc from saving it, named
// the way a user reads them.

// tcpState is a socket's state as /proc/net/tcp gives it (the kernel's
// TCP_* numbers).
type tcpState uint8

const (
	tcpEstablished tcpState = 0x01
	tcpTimeWait    tcpState = 0x06
	tcpClose       tcpState = 0x07
	tcpListen      tcpState = 0x0A
)

var tcpStateNames = [...]string{
	0x01: "ESTABLISHED", 0x02: "SYN_SENT", 0x03: "SYN_RECV", 0x04: "FIN_WAIT1",
	0x05: "FIN_WAIT2", 0x06: "TIME_WAIT", 0x07: "CLOSE", 0x08: "CLOSE_WAIT",
	0x09: "LAST_ACK", 0x0A: "LISTEN", 0x0B: "CLOSING",
}

func (s tcpState) String() string {
	if int(s) < len(tcpStateNames) && tcpStateNames[s] != "" {
		return tcpStateNames[s]
	}
	return fmt.Sprintf("state %02X", uint8(s))
}

// tcpSocket is one line of the table.
type tcpSocket struct {
	local, remote netip.AddrPort
	state         tcpState
}

// agentHome is the agent's listener for sandboxd.internal inside every
// sandbox (sandbox-agent --home), where it accepts the connections it
// forwards home.
var agentHome = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 80)

// String names the socket as a user reads it: "0.0.0.0:8080 LISTEN",
// "127.0.0.1:24429 → 127.0.0.1:80 ESTABLISHED", with what a connection to
// the agent's listener leads to.
func (s tcpSocket) String() string {
	if s.state == tcpListen {
		return fmt.Sprintf("%s %s", s.local, s.state)
	}
	out := fmt.Sprintf("%s → %s %s", s.local, s.remote, s.state)
	if s.remote == agentHome {
		out += " (to sandboxd.internal)"
	}
	return out
}

// blocksSave says whether the socket keeps Debian's 2022 runsc from
// saving the sandbox. Every socket a process holds does, but closed ones
// (TIME_WAIT, CLOSE) and sandboxd's own: the agent's listener for
// sandboxd.internal, which ListenHome keeps saveable, and the connections
// it accepted there, which it closes when its session ends, before the
// save (see disconnect). A process's own connection to sandboxd.internal
// is its own: it stays open across the save, so it counts.
func (s tcpSocket) blocksSave() bool {
	if s.state == tcpTimeWait || s.state == tcpClose {
		return false
	}
	return s.local != agentHome
}

// parseTCPTable reads the sockets of a /proc/net/tcp or /proc/net/tcp6
// text; lines it cannot read are skipped.
func parseTCPTable(table string) []tcpSocket {
	var out []tcpSocket
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		// sl local_address rem_address st ...
		if len(f) < 4 || !strings.HasSuffix(f[0], ":") {
			continue
		}
		local, err1 := parseProcAddr(f[1])
		remote, err2 := parseProcAddr(f[2])
		st, err3 := strconv.ParseUint(f[3], 16, 8)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		out = append(out, tcpSocket{local: local, remote: remote, state: tcpState(st)})
	}
	return out
}

// parseProcAddr decodes an address of the table: hex of the address as
// the kernel holds it, in 32-bit words of host byte order (little-endian
// on the hosts sandboxd runs on; 8 digits for IPv4, 32 for IPv6), a
// colon, and the port in hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	addrHex, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q: no port", s)
	}
	raw, err := hex.DecodeString(addrHex)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q: not 8 or 32 hex digits", s)
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: port: %w", s, err)
	}
	// Each 32-bit word was printed as a little-endian number: its bytes
	// in network order are reversed.
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}
