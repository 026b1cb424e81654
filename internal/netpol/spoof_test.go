package netpol

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestSpoofedSourcesDropped: guest root adds addresses to its eth0 (another
// sandbox's address in the pool, an outside one) and sends from them; only
// datagrams from the sandbox's own address reach the internet.
func TestSpoofedSourcesDropped(t *testing.T) {
	requireRoot(t)
	securitytest.Attack(t, "network", "guest root adds another sandbox's pool address and an outside address to eth0 and sends UDP from them to the internet",
		"the sandbox's out chain drops every packet whose source is not its own address; datagrams from its own address still arrive")
	in := newInternet(t)
	m := newManager(t, "tnw", "10.207.0.0/16", nil)
	ctx := context.Background()
	n, err := m.Setup(ctx, "sb-spoof", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}
	// A neighbour, so that its address is a live one in the pool.
	other, err := m.Setup(ctx, "sb-victim", Policy{Mode: ModeEgress})
	if err != nil {
		t.Fatal(err)
	}

	// A UDP sink on the internet that records what it hears: each datagram
	// carries the source it was sent from (masquerading hides the source
	// of those that pass as the sandbox's).
	sink := netip.AddrPortFrom(inetB, 9999)
	var pc net.PacketConn
	if err := inNetns(filepath.Join(netnsDir, in.netns), func() (err error) {
		pc, err = net.ListenPacket("udp", sink.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	go func() {
		buf := make([]byte, 64)
		for {
			k, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			mu.Lock()
			seen[string(buf[:k])]++
			mu.Unlock()
		}
	}()

	outside := netip.MustParseAddr("203.0.113.77")
	spoofs := []netip.Addr{other.GuestAddr, outside, n.HostAddr}
	// What guest root can do: put the addresses on its own interface.
	if err := inNetns(n.Netns, func() error {
		ns, err := netns.Get()
		if err != nil {
			return err
		}
		defer ns.Close()
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			return err
		}
		defer h.Close()
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, a := range spoofs[:2] {
			if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(a, 32)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	send := func(from netip.Addr) error {
		return inNetns(n.Netns, func() error {
			c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(from, 0)))
			if err != nil {
				// The gateway's address is not on the guest: a raw
				// socket would be needed; binding fails, which is fine.
				if from == n.HostAddr {
					return nil
				}
				return err
			}
			defer c.Close()
			for range 3 {
				if _, err := c.WriteToUDPAddrPort([]byte(from.String()), sink); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for _, a := range append(spoofs, n.GuestAddr) {
		if err := send(a); err != nil {
			t.Fatalf("send from %s: %v", a, err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		got := seen[n.GuestAddr.String()]
		mu.Unlock()
		if got > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // let late spoofed datagrams arrive too
	mu.Lock()
	defer mu.Unlock()
	for from, count := range seen {
		if from != n.GuestAddr.String() {
			t.Errorf("the internet received %d datagrams sent from the spoofed source %s", count, from)
		}
	}
	if seen[n.GuestAddr.String()] != 3 {
		t.Errorf("the internet received %d datagrams from the sandbox's own address, want 3: %v", seen[n.GuestAddr.String()], seen)
	}
}
