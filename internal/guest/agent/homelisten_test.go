package agent

import (
	"net"
	"testing"
)

// TestListenHome: the listener accepts connections, and a bind that fails
// (the address is taken) is an error, not a listener that never accepts.
func TestListenHome(t *testing.T) {
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	l, err := ListenHome(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l2, err := ListenHome(addr); err == nil {
		l2.Close()
		t.Fatal("a second listener on a taken address was made")
	}
	go func() {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Write([]byte("x"))
			c.Close()
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("read %q %v", b, err)
	}
}
