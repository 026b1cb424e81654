package host

// The half of a backend's sandbox that every backend shares.

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/caplog"
	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Record is what every backend's meta.json records of a sandbox, embedded
// in the backend's meta (encoding/json keeps its fields at the top level of
// the file, where they were before there was a Record).
type Record struct {
	ID         string         `json:"id"` // "" for a sandbox never assigned one (warm, template builder)
	CID        string         `json:"cid"`
	BaseDir    string         `json:"base_dir"`
	BaseImage  string         `json:"base_image,omitempty"`
	Layers     []string       `json:"layers,omitempty"` // restored layer ids, bottom first
	Env        []string       `json:"env,omitempty"`
	Limits     runtime.Limits `json:"limits"`
	HomeSocket string         `json:"home_socket,omitempty"`
	Hostname   string         `json:"hostname"`
	// Network is the sandbox's network namespace and addressing; nil:
	// none.
	Network *runtime.Network `json:"network,omitempty"`
	// Volumes are the volume images mounted in it (Spec.Volumes).
	Volumes    []runtime.VolumeMount `json:"volumes,omitempty"`
	CgroupPath string                `json:"cgroup_path"`
	Created    time.Time             `json:"created"`
	Stopped    bool                  `json:"stopped,omitempty"`
}

// NewRecord is the record of a new sandbox cid of spec; its host cgroup is
// /sandboxd/<cid>.
func NewRecord(spec runtime.Spec, cid string) Record {
	return Record{
		ID: spec.ID, CID: cid, BaseDir: spec.BaseDir, BaseImage: spec.BaseImage,
		Env: spec.Env, Limits: spec.Limits, HomeSocket: spec.HomeSocket, Hostname: spec.Hostname,
		Network: spec.Network, Volumes: spec.Volumes, CgroupPath: "/sandboxd/" + cid, Created: time.Now().UTC(),
	}
}

// BlankRecord is enough of a record to destroy the sandbox cid whose own
// could not be read.
func BlankRecord(cid string) Record { return Record{CID: cid, CgroupPath: "/sandboxd/" + cid} }

// SandboxID implements Meta.
func (r Record) SandboxID() string { return r.ID }

// Halted says the sandbox will not get an agent session without being
// started again: it is stopped. A backend whose sandboxes halt otherwise
// too (paused) gives its meta its own Halted.
func (r Record) Halted() bool { return r.Stopped }

func (r Record) record() Record { return r }

// Recorded is a backend's meta: it embeds a Record.
type Recorded interface {
	Meta
	Halted() bool
	record() Record
}

// Attachment is the half of a backend's sandbox that every backend shares,
// embedded by each: its state directory and meta, the session with its
// agent (which reconnects) and the operations through it (Ops), and what
// serves the sandbox while this process has it attached (a context for the
// backend's helpers, the gate to sandboxd.internal).
type Attachment[M Recorded] struct {
	// Ops serves Exec, ReadFile, WriteFile, ListDir and AgentTransport
	// through the agent.
	Ops
	// Agent is the session with the guest agent.
	Agent Slot
	// Dir is the sandbox's state directory.
	Dir string

	// OpMu serializes what starts or ends the sandbox (boot, stop, pause,
	// resume, fork, destroy), held through the whole operation: a destroy
	// must not race a restore that brings the sandbox back.
	OpMu sync.Mutex
	// Mu guards M, Gone and the backend's own fields of the sandbox.
	Mu sync.Mutex
	M  M
	// Gone is set once the sandbox is destroyed.
	Gone bool

	cancel context.CancelFunc
	gate   *homegate.Gate
	cfg    Settings
}

// Settings are what a Base gives each of its sandboxes' attachments.
type Settings struct {
	// Home are the options of the gate to sandboxd.internal but for the
	// sandbox's own (Dial, Sandbox).
	Home homegate.Options
	// LogMaxBytes caps each log the guest can write (0: caplog's default).
	LogMaxBytes int64
	Log         *slog.Logger
}

// Init readies the attachment of sandbox s, the backend's, whose state
// directory is dir and meta m. agent waits for the agent's session (the
// backend knows when to give up); cfg comes from the Base
// (Base.Settings).
func (a *Attachment[M]) Init(s Sandbox, dir string, m M, agent func(context.Context) (*guest.Client, error), cfg Settings) {
	a.Dir, a.M, a.cfg = dir, m, cfg
	a.Ops = Ops{Conn: func() Conn {
		return Conn{Sandbox: s, Env: a.Meta().record().Env, Agent: agent}
	}}
}

// Path is a path in the state directory.
func (a *Attachment[M]) Path(p ...string) string {
	return filepath.Join(append([]string{a.Dir}, p...)...)
}

// Meta is the sandbox's meta now.
func (a *Attachment[M]) Meta() M {
	a.Mu.Lock()
	defer a.Mu.Unlock()
	return a.M
}

// SetMeta changes the meta with f and writes meta.json, unless the sandbox
// is gone (its directory with it).
func (a *Attachment[M]) SetMeta(f func(*M)) error {
	a.Mu.Lock()
	f(&a.M)
	m, gone := a.M, a.Gone
	a.Mu.Unlock()
	if gone {
		return nil
	}
	return WriteMeta(a.Dir, m)
}

// ID implements runtime.Sandbox.
func (a *Attachment[M]) ID() string { return a.Meta().SandboxID() }

// MarkGone implements Served.
func (a *Attachment[M]) MarkGone() {
	a.Mu.Lock()
	a.Gone = true
	a.Mu.Unlock()
}

// Begin starts an attachment under parent (the runtime's context) and
// returns its context, which Detach or the next Begin ends.
func (a *Attachment[M]) Begin(parent context.Context) context.Context {
	ctx, cancel := context.WithCancel(parent)
	a.Mu.Lock()
	old := a.cancel
	a.cancel = cancel
	a.Mu.Unlock()
	if old != nil {
		old()
	}
	return ctx
}

// Detach lets go of the sandbox without touching it: the attachment's
// context ends, the agent session and the gate close. A backend with more
// to let go of wraps it.
func (a *Attachment[M]) Detach() {
	a.Mu.Lock()
	cancel, gate := a.cancel, a.gate
	a.cancel, a.gate = nil, nil
	a.Mu.Unlock()
	c := a.Agent.Client()
	if cancel != nil {
		cancel()
	}
	if c != nil {
		c.Close()
	}
	if gate != nil {
		gate.Close()
	}
}

// ServeHome serves one connection to sandboxd.internal through the
// sandbox's gate (its limits), made on first use after an attach. A
// halted or destroyed sandbox's connections are refused.
func (a *Attachment[M]) ServeHome(conn net.Conn) {
	a.Mu.Lock()
	if a.Gone || a.M.record().Stopped {
		a.Mu.Unlock()
		conn.Close()
		return
	}
	if a.gate == nil {
		o := a.cfg.Home
		o.Dial, o.Sandbox = a.DialHome, a.ID
		a.gate = homegate.New(o)
	}
	gate := a.gate
	a.Mu.Unlock()
	gate.Serve(conn)
}

// DialHome connects a sandbox's sandboxd.internal connection to the API.
func (a *Attachment[M]) DialHome(ctx context.Context) (net.Conn, error) {
	sock := a.Meta().record().HomeSocket
	if sock == "" {
		return nil, errors.New("sandbox has no home socket")
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", sock)
}

// WaitAgent returns the agent's session, waiting for it to (re)connect: it
// fails with runtime.ErrNotRunning once the sandbox is halted or gone, or
// dead says so (asked every poll).
func (a *Attachment[M]) WaitAgent(ctx context.Context, poll time.Duration, dead func(context.Context) bool) (*guest.Client, error) {
	return a.Agent.Wait(ctx, poll, func() bool {
		a.Mu.Lock()
		defer a.Mu.Unlock()
		return a.M.Halted() || a.Gone
	}, dead)
}

// LogPipe makes the pipe name in the state directory that a process the
// guest controls (runsc, QEMU) writes its output into, and opens its write
// end: DrainLog keeps what comes through it, capped.
func (a *Attachment[M]) LogPipe(name string) (*os.File, error) {
	return caplog.Pipe(a.Path(name))
}

// DrainLog copies what comes through the pipe fifo (LogPipe) into the
// capped log file log, both in the state directory, until every writer
// has closed the pipe or ctx ends. A later sandboxd continues the same
// file.
func (a *Attachment[M]) DrainLog(ctx context.Context, fifo, log string) {
	if _, err := os.Lstat(a.Path(fifo)); err != nil {
		return // made by an older sandboxd, which wrote the log itself
	}
	cid := a.Meta().record().CID
	w, err := caplog.Open(a.Path(log), a.cfg.LogMaxBytes)
	if err != nil {
		a.cfg.Log.Warn("log not kept", "log", log, "cid", cid, "err", err)
		return
	}
	defer w.Close()
	if err := caplog.Drain(ctx, a.Path(fifo), w); err != nil && ctx.Err() == nil {
		a.cfg.Log.Warn("draining log", "log", log, "cid", cid, "err", err)
	}
	if d := w.Dropped(); d > 0 {
		a.cfg.Log.Info("log capped", "log", log, "cid", cid, "dropped_bytes", d)
	}
}
