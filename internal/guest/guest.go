// Package guest owns the protocol between the host (sandboxd) and the agent
// that runs inside every sandbox (cmd/sandbox-agent). Both sides import it, so
// the wire format lives in exactly one place.
//
// The transport is ONE reliable byte stream: today a unix socket that the
// agent dials out of a gVisor sandbox, later a virtio-serial port of a microVM.
// On that stream:
//
//  1. the agent sends a Hello frame and the host answers with a Welcome frame
//     (version negotiation: the host refuses an agent whose Protocol it does not
//     speak);
//  2. both sides then run yamux over the stream — the host as yamux client, the
//     agent as yamux server — so any number of operations run concurrently;
//  3. every operation is one yamux stream that starts with a FrameRequest
//     carrying a JSON Request; what follows depends on the Op (see the Op
//     constants). Streams opened by the host are operations on the sandbox;
//     streams opened by the agent are OpHome connections, which the host
//     forwards to the sandboxd API (the "way home").
//
// A frame is one type byte, a 4-byte big-endian payload length and the
// payload. Frames are small (at most MaxFrame bytes), so bulk data (files,
// process output) is split into many FrameData/FrameStdout/FrameStderr frames
// and flows under yamux's per-stream flow control.
//
// The agent runs where guest root can replace it, so the host treats every
// reply as hostile: frames are bounded (MaxFrame), replies are checked
// against the bounds in limits.go, every call has a deadline, and where the
// backend allows it (gVisor) the session is authenticated with a
// per-sandbox secret (Welcome.Challenge, Proof).
//
// Invariants: a stream carries exactly one operation; the side that opened a
// stream writes the request frame first; every stream ends with a terminal
// frame (FrameExit, FrameEnd or FrameResult) unless the session itself dies.
package guest

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// Protocol is the version of this protocol. The host accepts agents whose
// Hello.Protocol equals it; bump it on any incompatible change.
const Protocol = 1

// MaxFrame bounds a frame's payload so a corrupt length cannot make a reader
// allocate without limit.
const MaxFrame = 1 << 20

// chunkSize is how much bulk data one frame carries.
const chunkSize = 32 << 10

// FrameType says what a frame's payload is.
type FrameType byte

// Frame types. Host→agent: Request, Stdin, StdinClose, Resize, Signal, Data,
// End. Agent→host: Hello and Proof (handshake), Started, Stdout, Stderr,
// Exit, Header, Data, End, Result. Welcome is the host's handshake answer.
const (
	FrameHello      FrameType = 1
	FrameWelcome    FrameType = 2
	FrameRequest    FrameType = 3
	FrameStarted    FrameType = 4
	FrameStdin      FrameType = 5
	FrameStdinClose FrameType = 6
	FrameResize     FrameType = 7
	FrameSignal     FrameType = 8
	FrameStdout     FrameType = 9
	FrameStderr     FrameType = 10
	FrameExit       FrameType = 11
	FrameHeader     FrameType = 12
	FrameData       FrameType = 13
	FrameEnd        FrameType = 14
	FrameResult     FrameType = 15
	FrameProof      FrameType = 16
)

// Op names an operation, the first thing on every stream.
type Op string

// Operations. Host-opened streams:
//
//   - OpExec: Request.Exec; host sends Stdin*/StdinClose/Resize/Signal frames,
//     agent sends Started, Stdout*/Stderr* and a final Exit.
//   - OpReadFile: Request.Path; agent sends Header (FileInfo) or Result with an
//     error, then Data* and End.
//   - OpWriteFile: Request.Path, Request.Mode; host sends Data* and End, agent
//     answers Result.
//   - OpListDir: Request.Path; agent answers Result with Entries.
//   - OpSync: flush the sandbox's filesystems (sync(2)); Result.
//   - OpPing: Result with Health.
//   - OpOOMKill: kill the process using the most memory; Result with Killed.
//
// Agent-opened streams:
//
//   - OpHome: after the request frame the stream is a raw byte pipe to the
//     host's sandboxd API socket, one stream per TCP connection accepted on
//     the sandbox's sandboxd.internal:80.
const (
	OpExec      Op = "exec"
	OpReadFile  Op = "read"
	OpWriteFile Op = "write"
	OpListDir   Op = "list"
	OpSync      Op = "sync"
	OpPing      Op = "ping"
	OpOOMKill   Op = "oomkill"
	OpHome      Op = "home"
)

// Hello is the agent's first frame on a new connection.
type Hello struct {
	Protocol int    `json:"protocol"`
	Agent    string `json:"agent"`  // agent build version
	Kernel   string `json:"kernel"` // uname release and version seen inside
	PID      int    `json:"pid"`    // the agent's pid inside the sandbox
	Boot     string `json:"boot"`   // random per agent process: tells a restart from a reconnect
}

// Welcome is the host's answer to Hello. A non-empty Error means the host
// refused the agent and will close the connection. A Challenge asks the
// agent to prove it holds the sandbox's secret (see Proof) before the
// session starts.
type Welcome struct {
	Protocol  int    `json:"protocol"`
	Error     string `json:"error,omitempty"`
	Challenge []byte `json:"challenge,omitempty"`
}

// Proof answers a Welcome's Challenge: ProofMAC of the challenge under the
// per-sandbox secret the host gave the real agent out of band. Any other
// process in the sandbox can reach the agent socket, but without the secret
// it cannot start a session.
type Proof struct {
	MAC []byte `json:"mac"`
}

// SecretEnv is the environment variable a backend that can hand a secret
// to the agent alone (gVisor: its init's environment) passes it in, hex
// encoded. The agent removes it at start.
const SecretEnv = "SANDBOXD_AGENT_SECRET"

// ChallengeSize is the length of a Welcome's Challenge.
const ChallengeSize = 32

// ProofMAC is the MAC that proves knowledge of secret for challenge.
func ProofMAC(secret, challenge []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("sandboxd agent proof v1\x00"))
	m.Write(challenge)
	return m.Sum(nil)
}

// Request starts every stream.
type Request struct {
	Op   Op        `json:"op"`
	Exec *ExecSpec `json:"exec,omitempty"`
	Path string    `json:"path,omitempty"`
	Mode uint32    `json:"mode,omitempty"`
	// Layer and Clock carry the arguments of the VM operations (vm.go).
	Layer *LayerRequest `json:"layer,omitempty"`
	Clock *ClockRequest `json:"clock,omitempty"`
}

// ExecSpec is what to run. Env is the complete extra environment (the host
// has already merged the sandbox's and the request's); the agent adds it to
// its own defaults (PATH, HOME, LANG, TERM).
type ExecSpec struct {
	Cmd     []string `json:"cmd"`
	Env     []string `json:"env,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	TTY     bool     `json:"tty,omitempty"`
	Rows    uint16   `json:"rows,omitempty"`
	Cols    uint16   `json:"cols,omitempty"`
	Stdin   bool     `json:"stdin,omitempty"`      // false: stdin is /dev/null
	Timeout int64    `json:"timeout_ms,omitempty"` // 0: none
}

// Started reports the pid of a started process.
type Started struct {
	PID int `json:"pid"`
}

// Resize changes a TTY's window size.
type Resize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Signal asks the agent to signal the process's session.
type Signal struct {
	Signal int `json:"signal"`
}

// Exit is the last frame of an exec stream.
type Exit struct {
	Code      int    `json:"code"`             // exit status, or 128+signal
	Signal    int    `json:"signal,omitempty"` // set when killed by a signal
	TimedOut  bool   `json:"timed_out,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	NotFound  bool   `json:"not_found,omitempty"` // Cmd[0] was not found (Code 127)
	Error     string `json:"error,omitempty"`     // the process could not be started
}

// FileInfo describes a file or directory entry.
type FileInfo struct {
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // Go fs.FileMode bits
	ModTime time.Time `json:"mtime"`
	Link    string    `json:"link,omitempty"` // symlink target
}

// Health is the answer to OpPing.
type Health struct {
	Uptime    float64 `json:"uptime_s"`
	Processes int     `json:"processes"`
	MemTotal  int64   `json:"mem_total"`
	MemFree   int64   `json:"mem_free"`
}

// Killed names the process OpOOMKill killed; PID 0 when there was none.
type Killed struct {
	PID  int    `json:"pid"`
	Name string `json:"name,omitempty"`
	RSS  int64  `json:"rss,omitempty"`
}

// Result ends a non-exec stream. Error is empty on success; ErrorKind
// classifies it so the host can map it to a typed error.
type Result struct {
	Error     string     `json:"error,omitempty"`
	ErrorKind string     `json:"error_kind,omitempty"` // "not_found", "is_dir", "other"
	Size      int64      `json:"size,omitempty"`
	Entries   []FileInfo `json:"entries,omitempty"`
	Health    *Health    `json:"health,omitempty"`
	Killed    *Killed    `json:"killed,omitempty"`
}

// End closes a data transfer; a non-empty Error means it failed midway.
type End struct {
	Error string `json:"error,omitempty"`
}

// Error kinds carried in Result.ErrorKind.
const (
	KindNotFound = "not_found"
	KindIsDir    = "is_dir"
	KindOther    = "other"
)

// ErrProtocol is returned when a peer breaks the protocol.
var ErrProtocol = errors.New("guest protocol error")

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("%w: frame of %d bytes exceeds %d", ErrProtocol, len(payload), MaxFrame)
	}
	// One Write per frame: yamux streams are safe for one writer at a time,
	// and a single write keeps the header and payload together.
	buf := make([]byte, 5+len(payload))
	buf[0] = byte(t)
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(payload)))
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame. It reads exactly the frame's bytes and nothing
// more, so a stream may switch to raw bytes after a frame (OpHome does).
func ReadFrame(r io.Reader) (FrameType, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes exceeds %d", ErrProtocol, n, MaxFrame)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return FrameType(hdr[0]), payload, nil
}

// WriteJSON writes v as the payload of a frame of type t.
func WriteJSON(w io.Writer, t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame %d: %w", t, err)
	}
	return WriteFrame(w, t, b)
}

// ReadJSON reads a frame that must be of type t and decodes it into v.
func ReadJSON(r io.Reader, t FrameType, v any) error {
	got, payload, err := ReadFrame(r)
	if err != nil {
		return err
	}
	if got != t {
		return fmt.Errorf("%w: got frame %d, want %d", ErrProtocol, got, t)
	}
	if err := json.Unmarshal(payload, v); err != nil {
		return fmt.Errorf("%w: decode frame %d: %v", ErrProtocol, t, err)
	}
	return nil
}

// yamuxConfig is the session configuration both sides use. Keepalives find
// a dead peer (a killed sandbox, a restarted host) within a minute; logs go
// nowhere because session errors surface as operation errors.
func yamuxConfig() *yamux.Config {
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
