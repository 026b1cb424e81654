// Package guest owns the protocol between the host (sandboxd) and the agent
// that runs inside every sandbox (cmd/sandbox-agent): the host's client
// (Client) and the transport both sides use. The services themselves are
// declared in the IDL at the repository's proto/ and generated into
// internal/guest/pb: the process and filesystem services in the shape of
// E2B's envd, and sandboxd's own agent service.
//
// The transport is ONE reliable byte stream: a unix socket that the agent
// dials out of a gVisor sandbox, or a microVM's virtio-serial port. On it:
//
//  1. a handshake of size-delimited protobuf messages (agent.v1 Hello,
//     Welcome, Proof): the agent says Hello, the host answers Welcome —
//     refusing an agent of another Protocol or challenging it to prove it
//     holds the sandbox's secret — and a challenged agent answers Proof;
//  2. then yamux, the host as yamux client and the agent as server;
//  3. every stream the host opens carries one HTTP/2 cleartext connection,
//     whose requests — any number at once, each with its own flow control —
//     are Connect RPCs or the agent's plain HTTP endpoints (/health,
//     /files). Every stream the agent opens is one connection a process in
//     the sandbox made to sandboxd.internal:80 (the way home), spliced as
//     raw bytes to the host's API.
//
// Processes belong to the agent, not to the stream that started them: a
// host that goes away (restarts, loses the session) finds them again by pid
// or tag (Client.Attach), with the tail of their output kept meanwhile.
//
// The agent runs where guest root can replace it, so the host treats every
// reply as hostile: messages are bounded (MaxMessage), replies are checked
// against the bounds in limits.go, every call has a deadline, and where the
// backend allows it (gVisor) the session is authenticated with a
// per-sandbox secret.
package guest

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/yamux"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
)

// Protocol is the version of this protocol. The host accepts agents whose
// Hello says the same; bump it on any incompatible change. (1 was the
// hand-written framing this replaced.)
const Protocol = 2

// MaxMessage bounds one protobuf message either side reads, so a corrupt
// or hostile length cannot make a reader allocate without limit. Bulk data
// (file bodies, output) flows in many smaller chunks.
const MaxMessage = 1 << 20

// maxHandshakeMessage bounds a handshake message.
const maxHandshakeMessage = 4 << 10

// chunkSize is how much bulk data one message carries.
const chunkSize = 32 << 10

// Hello is what an agent says about itself on every connection. It is
// kept (a microVM's saved Hello) as JSON in the runtime's state.
type Hello struct {
	Protocol int    `json:"protocol"`
	Agent    string `json:"agent"`  // agent build version
	Kernel   string `json:"kernel"` // uname release and version seen inside
	PID      int    `json:"pid"`    // the agent's pid inside the sandbox
	Boot     string `json:"boot"`   // random per agent process: tells a restart from a reconnect
}

// Message converts h to its wire form.
func (h Hello) Message() *agentv1.Hello {
	return &agentv1.Hello{Protocol: uint32(h.Protocol), Agent: h.Agent, Kernel: h.Kernel, Pid: uint32(h.PID), Boot: h.Boot}
}

func helloFrom(m *agentv1.Hello) Hello {
	return Hello{Protocol: int(m.GetProtocol()), Agent: m.GetAgent(), Kernel: m.GetKernel(), PID: int(m.GetPid()), Boot: m.GetBoot()}
}

// SecretEnv is the environment variable a backend that can hand a secret
// to the agent alone (gVisor: its init's environment) passes it in, hex
// encoded. The agent removes it at start.
const SecretEnv = "SANDBOXD_AGENT_SECRET"

// ChallengeSize is the length of a Welcome's challenge.
const ChallengeSize = 32

// ProofMAC is the MAC that proves knowledge of secret for challenge.
func ProofMAC(secret, challenge []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("sandboxd agent proof v1\x00"))
	m.Write(challenge)
	return m.Sum(nil)
}

// ErrProtocol is returned when a peer breaks the protocol.
var ErrProtocol = errors.New("guest protocol error")

// WriteMessage writes one size-delimited handshake message.
func WriteMessage(w io.Writer, m proto.Message) error {
	var b bytes.Buffer
	if _, err := protodelim.MarshalTo(&b, m); err != nil {
		return fmt.Errorf("encode %s: %w", m.ProtoReflect().Descriptor().Name(), err)
	}
	// One Write: the length and the message stay together.
	_, err := w.Write(b.Bytes())
	return err
}

// ReadMessage reads one size-delimited handshake message into m. It reads
// exactly the message's bytes and nothing more, so yamux can take over the
// stream after it.
func ReadMessage(r io.Reader, m proto.Message) error {
	err := protodelim.UnmarshalOptions{MaxSize: maxHandshakeMessage}.UnmarshalFrom(byteReader{r}, m)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return err
	default:
		var se *protodelim.SizeTooLargeError
		if errors.As(err, &se) {
			return fmt.Errorf("%w: handshake message of %d bytes exceeds %d", ErrProtocol, se.Size, maxHandshakeMessage)
		}
		return fmt.Errorf("%w: decode %s: %v", ErrProtocol, m.ProtoReflect().Descriptor().Name(), err)
	}
}

// byteReader reads one byte at a time where protodelim asks for a
// ByteReader: buffering would swallow the bytes after the message.
type byteReader struct{ io.Reader }

func (b byteReader) ReadByte() (byte, error) {
	var c [1]byte
	if _, err := io.ReadFull(b.Reader, c[:]); err != nil {
		return 0, err
	}
	return c[0], nil
}

// YamuxConfig is the session configuration both sides use. Keepalives
// find a dead peer (a killed sandbox, a restarted host) within a minute;
// logs go nowhere because session errors surface as operation errors.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	// Larger windows keep bulk file transfers from stalling on round trips.
	c.MaxStreamWindowSize = 1 << 20
	// A stream we closed whose peer never closes its side is reset after
	// this, so a hostile peer cannot make us keep streams without end.
	c.StreamCloseTimeout = 30 * time.Second
	return c
}

// ExecSpec is what to run. Env is the complete extra environment (the host
// has already merged the sandbox's and the request's); the agent adds it to
// its own defaults (PATH, HOME, LANG, TERM).
type ExecSpec struct {
	Cmd []string
	Env []string
	Cwd string
	// User runs the process as this user of the sandbox (UserHeader);
	// empty: the agent's own.
	User    string
	TTY     bool
	Rows    uint16
	Cols    uint16
	Stdin   bool          // false: stdin is /dev/null
	Timeout time.Duration // 0: none
	// Tag names the process for a later Attach; unique among the agent's
	// processes (empty: none).
	Tag string
	// Detach leaves the process running when Exec's context ends.
	Detach bool
}

// Resize changes a TTY's window size.
type Resize struct {
	Rows uint16
	Cols uint16
}

// Exit is how a process ended.
type Exit struct {
	Code      int // exit status, or 128+signal
	Signal    int // set when killed by a signal
	TimedOut  bool
	OOMKilled bool
	NotFound  bool   // Cmd[0] was not found (Code 127)
	Error     string // the process could not be started
}

// FileInfo describes a file or directory entry.
type FileInfo struct {
	Name    string
	Size    int64
	Mode    uint32 // Go fs.FileMode bits
	ModTime time.Time
	Link    string // symlink target
}

// Health is the agent's view of the sandbox.
type Health struct {
	Uptime    float64
	Processes int
	MemTotal  int64
	MemFree   int64
}

// Killed names the process the memory guard killed; PID 0 when there was
// none.
type Killed struct {
	PID  int
	Name string
	RSS  int64
}

// Process is one process the agent started that still runs.
type Process struct {
	PID     int
	Tag     string
	Cmd     []string
	Cwd     string
	TTY     bool
	Started time.Time
}
