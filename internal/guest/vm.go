package guest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/yamux"
)

// Operations of agents that run as the init of a microVM (cmd/sandbox-agent
// vm-init), where the agent owns the guest kernel: its cgroups, its clock
// and its random number generator. Other agents answer them with an
// "unknown op" Result.
//
//   - OpFreeze: sync, then freeze every process the agent started (the
//     cgroup v2 freezer of agent.Options.Cgroup); Result. The agent itself
//     keeps serving, so files can still be read.
//   - OpThaw: thaw them; Result.
//   - OpExportLayer: Request.Layer; the agent freezes the processes (unless
//     they are frozen already), syncs, and streams its writable layer in the
//     snapshot package's format as Data frames, then End; it thaws what it
//     froze. The guest kernel reads its own file system: the host never
//     mounts a disk a guest has written.
//   - OpSetClock: Request.Clock; set the guest's wall clock and mix host
//     entropy into its random number generator, forcing a reseed. Needed
//     after a restore from a memory snapshot (the clock stood still and
//     every clone of a template would otherwise share one RNG state) and
//     after a pause; Result.
const (
	OpFreeze      Op = "freeze"
	OpThaw        Op = "thaw"
	OpExportLayer Op = "export-layer"
	OpSetClock    Op = "set-clock"
)

// LayerRequest is the argument of OpExportLayer: the manifest fields the
// guest cannot know.
type LayerRequest struct {
	Parent    string `json:"parent,omitempty"`
	BaseImage string `json:"base_image,omitempty"`
}

// ClockRequest is the argument of OpSetClock.
type ClockRequest struct {
	UnixNano int64  `json:"unix_nano"`
	Entropy  []byte `json:"entropy,omitempty"` // at most 512 bytes
}

// Freeze stops the sandbox's processes after flushing its writes.
func (c *Client) Freeze(ctx context.Context) error {
	_, err := c.call(ctx, Request{Op: OpFreeze})
	return err
}

// Thaw lets frozen processes run again.
func (c *Client) Thaw(ctx context.Context) error {
	_, err := c.call(ctx, Request{Op: OpThaw})
	return err
}

// SetClock sets the guest's clock to t and reseeds its RNG with entropy.
func (c *Client) SetClock(ctx context.Context, t time.Time, entropy []byte) error {
	_, err := c.call(ctx, Request{Op: OpSetClock, Clock: &ClockRequest{UnixNano: t.UnixNano(), Entropy: entropy}})
	return err
}

// ExportLayer streams the guest's writable layer in the snapshot format.
// The blob comes from the guest and is as untrusted as the files in it: the
// caller checks its manifest. Close the reader when done.
func (c *Client) ExportLayer(ctx context.Context, parent, baseImage string) (io.ReadCloser, error) {
	st, done, err := c.open(ctx, Request{Op: OpExportLayer, Layer: &LayerRequest{Parent: parent, BaseImage: baseImage}})
	if err != nil {
		return nil, err
	}
	return &fileReader{ctx: ctx, c: c, st: st, done: done, path: "writable layer"}, nil
}

// ReadHello reads an agent's Hello on a new connection without answering
// it. The agent then waits for the Welcome; a host that saves the VM's
// memory at this point (a template, a paused sandbox) answers later, on a
// connection to the restored VM, with Resume: the restored agent's session
// starts where the saved one stopped, with no stale session to time out.
func ReadHello(conn net.Conn, timeout time.Duration) (Hello, error) {
	_ = conn.SetDeadline(time.Now().Add(timeout))
	defer conn.SetDeadline(time.Time{})
	var h Hello
	if err := ReadJSON(conn, FrameHello, &h); err != nil {
		return h, fmt.Errorf("read agent hello: %w", err)
	}
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
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := WriteJSON(conn, FrameWelcome, Welcome{Protocol: Protocol}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("write welcome: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	sess, err := yamux.Client(conn, yamuxConfig())
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start session: %w", err)
	}
	return newClient(h, sess, opts, log), nil
}
