package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ListenHome listens on addr (the sandbox's sandboxd.internal, an IPv4
// address and port) with a socket that Go's poller never watches: Accept
// blocks in the kernel, on a thread of its own.
//
// Why: gVisor cannot checkpoint a TCP endpoint that an epoll set watches
// (runsc 2022: "endpoint still has waiters upon save"), and Go's poller
// watches every socket it opens for as long as it is open, so a plain
// net.Listen would keep every sandbox from being paused. A thread blocked
// in accept is no such waiter: the sentry interrupts it to save and it
// starts the accept again once restored. Connections accepted are ordinary
// net.Conns (polled); ServeHome closes them when their session ends, which
// a pause begins with.
func ListenHome(addr string) (net.Listener, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("listen home %q: not an IPv4 address and port", addr)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listen home: %w", err)
	}
	sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err == nil {
		err = unix.Bind(fd, sa)
	}
	if err == nil {
		err = unix.Listen(fd, 128)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listen home %s: %w", addr, err)
	}
	return &blockingListener{fd: fd, addr: net.TCPAddrFromAddrPort(ap)}, nil
}

// blockingListener is ListenHome's listener.
type blockingListener struct {
	fd     int
	addr   net.Addr
	closed atomic.Bool
}

// Accept implements net.Listener.
func (l *blockingListener) Accept() (net.Conn, error) {
	for {
		nfd, _, err := unix.Accept4(l.fd, unix.SOCK_CLOEXEC)
		if l.closed.Load() {
			if err == nil {
				unix.Close(nfd)
			}
			return nil, net.ErrClosed
		}
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("accept home connection: %w", err)
		}
		f := os.NewFile(uintptr(nfd), "home")
		c, err := net.FileConn(f) // a dup, in the poller
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("accept home connection: %w", err)
		}
		return c, nil
	}
}

// Close implements net.Listener: shutdown wakes a blocked Accept (close
// alone would not).
func (l *blockingListener) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	_ = unix.Shutdown(l.fd, unix.SHUT_RDWR)
	return unix.Close(l.fd)
}

// Addr implements net.Listener.
func (l *blockingListener) Addr() net.Addr { return l.addr }
