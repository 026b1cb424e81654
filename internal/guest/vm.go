package guest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
)

// Operations of agents that run as the init of a microVM (cmd/sandbox-agent
// vm-init), where the agent owns the guest kernel: its cgroups, its clock
// and its random number generator (agent.v1's Freeze, Thaw, ExportLayer,
// SetClock). Other agents answer them unimplemented.

// Freeze stops the sandbox's processes after flushing its writes.
func (c *Client) Freeze(ctx context.Context) error {
	_, err := unary(ctx, c, "freeze", c.agent.Freeze, &agentv1.FreezeRequest{})
	return err
}

// Thaw lets frozen processes run again.
func (c *Client) Thaw(ctx context.Context) error {
	_, err := unary(ctx, c, "thaw", c.agent.Thaw, &agentv1.ThawRequest{})
	return err
}

// SetClock sets the guest's clock to t and reseeds its RNG with entropy.
func (c *Client) SetClock(ctx context.Context, t time.Time, entropy []byte) error {
	_, err := unary(ctx, c, "set clock", c.agent.SetClock, &agentv1.SetClockRequest{UnixNano: t.UnixNano(), Entropy: entropy})
	return err
}

// NetConfig is a guest's link to the sandbox network (agent.v1
// ConfigureNetwork). The zero NetConfig takes the link down.
type NetConfig struct {
	MAC         string       // hardware address; empty keeps the link's
	Address     netip.Prefix // the guest's address and prefix length
	Gateway     netip.Addr
	Nameservers []string
	MTU         int // 0 keeps the link's
}

// ConfigureNetwork sets up the guest's link: at boot, and after every
// restore from a memory snapshot, which brings back another sandbox's
// address and hardware address (or none).
func (c *Client) ConfigureNetwork(ctx context.Context, n NetConfig) error {
	req := &agentv1.ConfigureNetworkRequest{Mac: n.MAC, Nameservers: n.Nameservers, Mtu: uint32(n.MTU)}
	if n.Address.IsValid() {
		req.Address, req.Gateway = n.Address.String(), n.Gateway.String()
	}
	_, err := unary(ctx, c, "configure network", c.agent.ConfigureNetwork, req)
	return err
}

// ExportLayer streams the guest's writable layer in the snapshot format.
// The blob comes from the guest and is as untrusted as the files in it: the
// caller checks its manifest. Each chunk must come within CallTimeout.
// Close the reader when done.
func (c *Client) ExportLayer(ctx context.Context, parent, baseImage string) (io.ReadCloser, error) {
	sctx, cancel := context.WithCancel(ctx)
	wd := newWatchdog(c.opts.CallTimeout, cancel)
	stream, err := c.agent.ExportLayer(sctx, connect.NewRequest(&agentv1.ExportLayerRequest{Parent: parent, BaseImage: baseImage}))
	if err != nil {
		wd.stop()
		cancel()
		if wd.barked() {
			err = ErrNoAnswer
		}
		return nil, c.fail(ctx, "export layer", err)
	}
	return &layerReader{ctx: ctx, c: c, stream: stream, wd: wd, cancel: cancel}, nil
}

type layerReader struct {
	ctx    context.Context
	c      *Client
	stream *connect.ServerStreamForClient[agentv1.ExportLayerResponse]
	wd     *watchdog
	cancel context.CancelFunc
	buf    []byte
	err    error
}

func (l *layerReader) Read(p []byte) (int, error) {
	for len(l.buf) == 0 {
		if l.err != nil {
			return 0, l.err
		}
		l.wd.kick()
		ok := l.stream.Receive()
		l.wd.t.Stop()
		switch {
		case ok:
			l.buf = l.stream.Msg().GetData()
		case l.stream.Err() == nil:
			l.err = io.EOF
		default:
			err := l.stream.Err()
			if l.wd.barked() {
				err = ErrNoAnswer
			}
			l.err = l.c.fail(l.ctx, "export layer", err)
		}
	}
	n := copy(p, l.buf)
	l.buf = l.buf[n:]
	return n, nil
}

func (l *layerReader) Close() error {
	l.wd.stop()
	err := l.stream.Close()
	l.cancel()
	return err
}

// ReadHello reads an agent's Hello on a new connection without answering
// it. The agent then waits for its Welcome; a host that saves the VM's
// memory at this point (a template, a paused sandbox) answers later, on a
// connection to the restored VM, with Resume: the restored agent's session
// starts where the saved one stopped, with no stale session to time out.
func ReadHello(conn net.Conn, timeout time.Duration) (Hello, error) {
	_ = conn.SetDeadline(time.Now().Add(timeout))
	defer conn.SetDeadline(time.Time{})
	var m agentv1.Hello
	if err := ReadMessage(conn, &m); err != nil {
		return Hello{}, fmt.Errorf("read agent hello: %w", err)
	}
	h := helloFrom(&m)
	if h.Protocol != Protocol {
		return h, fmt.Errorf("%w: host speaks protocol %d, agent %d", ErrProtocol, Protocol, h.Protocol)
	}
	if err := CheckHello(h); err != nil {
		return h, err
	}
	return h, nil
}

// Resume completes the handshake of an agent whose Hello was read with
// ReadHello (on another connection, before a save and restore) and starts
// the session. It owns conn from then on.
func Resume(conn net.Conn, h Hello, opts ClientOptions) (*Client, error) {
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := WriteMessage(conn, &agentv1.Welcome{Protocol: Protocol}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("write welcome: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	return startSession(conn, h, opts)
}
