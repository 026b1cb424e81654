// Package runtime defines what a sandbox backend is: a small, containerd-like
// interface (Runtime creates and finds sandboxes, Sandbox runs processes,
// moves files, snapshots its writable layer and goes away) that the rest of
// sandboxd programs against. Backends live in subpackages (runtime/gvisor,
// later runtime/microvm); the core never imports a backend's details, and
// every backend passes the conformance suite in runtime/runtimetest.
//
// Invariants every backend keeps:
//   - Create returns a running sandbox whose agent answers; a sandbox never
//     exists half-made: on error everything Create made is gone.
//   - A sandbox's filesystem is a read-only base (Spec.BaseDir), the layers
//     it was restored from (read-only), and one writable layer; Snapshot
//     captures exactly that writable layer in the snapshot package's format.
//   - Sandboxes outlive the Runtime value: after a restart, New on the same
//     state directory finds them again (Get, List).
//   - Destroy leaves nothing behind on the host and is idempotent.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// Errors shared by all backends; test with errors.Is.
var (
	// ErrNotFound: no sandbox with that id exists on this host.
	ErrNotFound = errors.New("sandbox not found")
	// ErrNotRunning: the sandbox exists but is stopped (or died).
	ErrNotRunning = errors.New("sandbox is not running")
	// ErrCommandNotFound: Exec's Cmd[0] does not exist in the sandbox. Exec
	// then also returns ExecResult{ExitCode: 127} and writes a shell-like
	// "command not found" line to Stderr, so callers that only forward the
	// output and exit code behave like a shell.
	ErrCommandNotFound = errors.New("command not found")
	// ErrExists: Create was given an id that is already in use.
	ErrExists = errors.New("sandbox already exists")
	// ErrCannotPause means a Pauser or Forker refused to save a sandbox
	// (a pause, a fork) in its present state, or on a runtime that
	// cannot save it; it keeps running as it was, and the error says why.
	ErrCannotPause = errors.New("the sandbox cannot be paused now")
	// ErrNotMovable means a Mover refused to save or restore a sandbox to
	// move it (not paused, volumes mounted, another accelerator); the
	// error says why.
	ErrNotMovable = errors.New("sandbox cannot be moved")
)

// Runtime creates sandboxes of one backend on this host.
type Runtime interface {
	// Name is the backend's name, e.g. "gvisor".
	Name() string
	// Capabilities says what the backend can do, so that a request it
	// cannot serve is refused before anything is made for it.
	Capabilities() Capabilities
	// Create prepares and starts a sandbox and returns it running.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Get returns a sandbox present on this host, also one created by an
	// earlier process on the same state; ErrNotFound if there is none. The
	// sandbox may have stopped (see Sandbox.State).
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns the ids of all sandboxes present on this host, running or
	// not, so a restarted server can reconcile them with its database.
	List(ctx context.Context) ([]string, error)
	// Close releases the Runtime's own resources (connections, warm pool).
	// Created sandboxes keep running.
	Close() error
}

// Capabilities are what a backend supports beyond the common contract.
type Capabilities struct {
	// Network: Spec.Network is honoured (a sandbox network in a netns).
	Network bool
	// MemorySnapshot: a running sandbox's memory can be saved and
	// restored (pause/resume, templates).
	MemorySnapshot bool
	// AnyRootFS: Spec.BaseDir may be any unpacked image's directory (a
	// template's): files of any owner, setuid files, hard links and
	// symlinks, no init and no agent of its own.
	AnyRootFS bool
}

// Layer is a snapshot to restore, as a stream in the snapshot format.
type Layer struct {
	ID string // the layer's content address; verified while restoring when it is "sha256:..."
	R  io.Reader
}

// Spec describes a sandbox to create.
type Spec struct {
	// ID names the sandbox; it must be unique on the host. Letters, digits,
	// '-', '_' and '.'; at most 128 bytes.
	ID string
	// BaseDir is the root filesystem, used read-only and shared.
	BaseDir string
	// BaseImage identifies BaseDir; recorded in snapshots.
	BaseImage string
	// Template is the id of the custom template the sandbox is of (""
	// for the server's built-in image). Backends record nothing of it:
	// it keys the pools of sandboxes started ahead (PoolKey), so that one
	// started for a template never serves another template's create, not
	// even one of the same image (a deleted template's directory may be
	// made again under the same path for a new one).
	Template string
	// Layers is the snapshot chain to restore, bottom first. The sandbox's
	// next Snapshot records the last one as its parent.
	Layers []Layer
	// Env is added to every process's environment (before ExecRequest.Env).
	Env []string
	// Limits; zero fields take the runtime's defaults.
	Limits Limits
	// HomeSocket is the host's sandboxd API unix socket, reachable inside as
	// http://sandboxd.internal. Empty: connections home are refused.
	HomeSocket string
	// Hostname inside the sandbox; empty means "sandbox".
	Hostname string
	// Network, when set, is the network namespace (made and policed on the
	// host by package netpol) the sandbox's network lives in; nil: loopback
	// only. http://sandboxd.internal works either way: it goes through the
	// agent's channel home, not the network.
	Network *Network
	// Owner is whom the sandbox is for (the account). A sandbox a
	// Prewarmer started for one owner is handed only to a Create of the
	// same owner; "" never gets one.
	Owner string
	// Volumes are ext4 disk images mounted into the sandbox (package
	// volumes makes and syncs them). A sandbox with volumes is always
	// created cold: nothing started ahead has them.
	Volumes []VolumeMount
}

// VolumeMount is a volume's disk image mounted in a sandbox at Path. The
// gVisor backend loop-mounts the image on the host (nosuid, nodev) and
// binds the mount into the sandbox, so the image is only ever written by
// the host's kernel; a microVM gets it as a virtio-blk disk its own
// kernel mounts. A read-write mount grows the file system to the image's
// size (the image may have been made larger since it was formatted).
type VolumeMount struct {
	Image    string `json:"image"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// WarmSizer is a Runtime whose built-in warm pool (sandboxes of its base
// image, for the creates that start fresh) its caller sizes as demand
// changes: the sandbox manager, which knows the creates and the node's
// disk. The pool starts what it lacks in the background, one at a time,
// and destroys its surplus.
type WarmSizer interface {
	SetWarmSize(n int)
}

// Unpacker is a Sandbox that writes a whole tree in one request: a tar
// archive unpacked into a directory by the sandbox's agent, without a
// process in the sandbox (host.Ops). Persistence lays out /workspace with
// it when the sandbox has it, and runs git in the sandbox otherwise.
type Unpacker interface {
	// Unpack writes the tar archive r into dir, made when missing:
	// directories, regular files and symbolic links, each resolved inside
	// dir. It returns the number of regular files written.
	Unpack(ctx context.Context, dir string, r io.Reader) (files int, err error)
}

// Prewarmer is a Runtime that starts sandboxes ahead of their create, from
// an owner's layers: an account's next sandbox, started from its snapshot
// as soon as the snapshot exists, is then handed out as fast as a sandbox
// from nothing. A Create is handed the owner's prewarmed sandbox only when
// its spec would have made the same sandbox: see PrewarmKey.
type Prewarmer interface {
	// Prewarm keeps up to want (at least 1) sandboxes of spec (its ID is
	// ignored) for spec.Owner, in place of what it kept for the owner from
	// another spec: when fewer are kept or starting, it starts one (the
	// spec's layers are read once: call again, with the layers opened
	// anew, for the next) and returns once it runs or failed, saying it
	// started one; when more are kept, the ready ones beyond want go.
	// Within the runtime's budget, the least recently prewarmed owners'
	// go first.
	Prewarm(ctx context.Context, spec Spec, want int) (started bool, err error)
	// DropPrewarmed destroys what is kept for owner (its snapshot went).
	DropPrewarmed(ctx context.Context, owner string) error
	// PrewarmStats says how many sandboxes are kept or starting (each
	// holds a disk like any sandbox's) and what became of the others.
	PrewarmStats() PrewarmStats
}

// PrewarmStats are a Prewarmer's counts since it was made.
type PrewarmStats struct {
	Kept    int    // kept or starting now
	Started uint64 // sandboxes started ahead
	Failed  uint64 // starts that failed
	Taken   uint64 // handed to a create
	Waited  uint64 // of those, handed out after the create waited for the start
	// Discarded were destroyed unused: superseded by a newer snapshot,
	// stale at a create, evicted by the budget, dropped, or abandoned.
	Discarded uint64
}

// PrewarmKey says what a sandbox started from spec is made of (owner, base,
// limits, hostname, restored layers), so that a prewarmed sandbox serves
// exactly the specs that would make its twin; ok is false for a spec a
// prewarmed sandbox can never serve: no owner, a network (its namespace
// is the new sandbox's own), volumes, or a layer whose id is not a verified content
// address (restoring checks a "sha256:" id against the stream, so equal
// ids are equal files). Env, HomeSocket and ID are the claim's own.
func PrewarmKey(spec Spec) (key string, ok bool) {
	if spec.Owner == "" || spec.Network != nil || len(spec.Volumes) > 0 {
		return "", false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%q %q %q %q %+v", spec.Owner, spec.Template, spec.BaseDir, spec.Hostname, spec.Limits)
	for _, l := range spec.Layers {
		if !strings.HasPrefix(l.ID, "sha256:") {
			return "", false
		}
		b.WriteString(" " + l.ID)
	}
	return b.String(), true
}

// Pooler is a Runtime that keeps pools of sandboxes started ahead of their
// creates for specs beyond its built-in warm pool's (custom templates'),
// for any owner. A pool's sandboxes are started from the specs its open
// makes, with no id, and are handed to a Create whose spec has their
// PoolKey: exactly the specs that would have started the same sandbox.
// What a started sandbox does not hold is the claim's own: its id, Env and
// HomeSocket (written when it is handed out, and given to every process
// the agent starts), and Owner.
type Pooler interface {
	// SetPool keeps size sandboxes of the specs open makes started ahead
	// in the pool called name (the caller's), refilled in the background
	// as they are taken, one start at a time over all pools. open is
	// called for each start (layers are streams, opened afresh); release
	// once the start ended. A smaller size destroys the surplus; size 0
	// removes the pool and destroys its sandboxes.
	SetPool(name string, size int, open func(ctx context.Context) (spec Spec, release func(), err error))
	// PoolStats says what the pools hold and what became of their
	// sandboxes.
	PoolStats() PoolReport
}

// PoolReport is a Pooler's figures.
type PoolReport struct {
	Warm  PoolStats   // the built-in warm pool's (zero when none)
	Pools []PoolStats // SetPool's, one each
	// Removed sums the counts of the pools removed since the runtime was
	// made, so that totals never go down.
	Removed PoolStats
}

// PoolStats are one pool's figures since it was made.
type PoolStats struct {
	Name     string // SetPool's
	Template string // its specs' Template
	Size     int    // sandboxes it keeps when full
	Ready    int    // started, waiting for a create
	Starting int
	// Hits are creates handed one of its sandboxes (Waited: after waiting
	// for its start), Misses creates of its specs' key that found none
	// ready or starting and started cold.
	Hits, Misses, Waited uint64
	// Started, Failed: its starts; Discarded: destroyed unused (the pool
	// shrank or went, its specs changed, or the runtime closed).
	Started, Failed, Discarded uint64
}

// PoolKey says what a sandbox started from spec is made of, for any
// owner: template, base, limits, hostname and restored layers. ok is false
// for a spec a pooled sandbox can never serve: a network (its namespace is
// the new sandbox's own), volumes, or a layer whose id is not a verified content
// address. Owner, Env, HomeSocket and ID are the claim's.
func PoolKey(spec Spec) (key string, ok bool) {
	if spec.Network != nil || len(spec.Volumes) > 0 {
		return "", false
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%q %q %q %q %+v", spec.Template, spec.BaseDir, spec.BaseImage, spec.Hostname, spec.Limits)
	for _, l := range spec.Layers {
		if !strings.HasPrefix(l.ID, "sha256:") {
			return "", false
		}
		b.WriteString(" " + l.ID)
	}
	return b.String(), true
}

// Network is where a sandbox's network comes from.
type Network struct {
	// Netns is the path of a network namespace holding the guest's link
	// (eth0, addressed and routed), e.g. /run/netns/sbx-0123456789.
	Netns string `json:"netns"`
	// Nameservers go into the guest's /etc/resolv.conf.
	Nameservers []string `json:"nameservers,omitempty"`
	// Address is eth0's address in Netns (with its prefix length) and
	// Gateway its default route's: a backend whose guest has a kernel of
	// its own (a microVM) gives them to the guest, whose link takes
	// eth0's place.
	Address netip.Prefix `json:"address,omitzero"`
	Gateway netip.Addr   `json:"gateway,omitzero"`
}

// Limits bound a sandbox's resources.
type Limits struct {
	CPUs        float64 // CPU time in cores (cfs quota); 0: unlimited
	MemoryBytes int64   // memory of the sandbox's processes
	Pids        int64   // processes and threads inside
	DiskBytes   int64   // size of the writable layer (restored layers count)
}

// Sandbox is one running (or stopped) sandbox. Methods are safe for
// concurrent use.
// EnvHolder is a sandbox that says the environment its processes start
// with (Spec.Env: the sandbox's own variables and its template's), for
// those a front end starts through the agent itself (the code
// interpreter's kernels).
type EnvHolder interface {
	ExecEnv() []string
}

type Sandbox interface {
	ID() string
	Info() Info
	// State reports whether the sandbox still runs.
	State(ctx context.Context) (State, error)
	// Exec runs a process and streams its output to the request's writers as
	// it is produced. The error is for failures to run at all (see
	// ErrCommandNotFound); a process that ran reports through ExecResult.
	// The process belongs to the sandbox's agent: when ctx ends it is
	// killed (unless the request says Detach); when only the host goes
	// away it runs on, and Attach finds it again.
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// Attach follows a process Exec started earlier, by pid or tag: the
	// output the agent kept of it from req.From on, then live output and
	// its end (a process that ended a short while ago is answered from
	// what the agent kept). Errors wrap fs.ErrNotExist for a process the
	// agent does not know (it ended long ago, or the agent restarted).
	Attach(ctx context.Context, req AttachRequest) (ExecResult, error)
	// Processes lists the processes started by Exec that still run.
	Processes(ctx context.Context) ([]Process, error)
	// SignalProcess sends sig to the session of process pid: the process
	// and everything it started. Errors wrap fs.ErrNotExist for a process
	// that does not run.
	SignalProcess(ctx context.Context, pid int, sig syscall.Signal) error
	// ReadFile streams a file out; errors wrap fs.ErrNotExist when missing.
	ReadFile(ctx context.Context, path string) (io.ReadCloser, error)
	// WriteFile atomically replaces path (creating parents) with r's bytes.
	WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error
	// ListDir lists a directory without following symlinks.
	ListDir(ctx context.Context, path string) ([]DirEntry, error)
	// AgentTransport carries requests to the guest agent's HTTP services
	// as they are (envd's Connect services process.Process and
	// filesystem.Filesystem, /files, /health), for an API that speaks
	// them to its clients (package e2b) or a copy through the filesystem
	// service: to the agent connected now, waiting for it to reconnect;
	// they may be addressed to any host. It fails with ErrNotRunning once
	// the sandbox is gone.
	AgentTransport(ctx context.Context) (http.RoundTripper, error)
	// Quiesce flushes the sandbox's writes and freezes it, for a consistent
	// copy of its filesystem; resume thaws it. Snapshot quiesces by itself.
	Quiesce(ctx context.Context) (resume func(context.Context) error, err error)
	// Snapshot writes the writable layer to w in the snapshot format, with
	// Parent set to the last restored layer. It works on a stopped sandbox
	// too.
	Snapshot(ctx context.Context, w io.Writer) (snapshot.Manifest, error)
	Stats(ctx context.Context) (Stats, error)
	// HostDiskBytes is what the writable layer occupies on the host's disk
	// now (a sparse image's allocated blocks), measured on the host
	// without asking the guest: cheap enough for every admission check.
	HostDiskBytes() int64
	// Stop kills every process; the writable layer stays for Snapshot.
	Stop(ctx context.Context) error
	// Destroy stops the sandbox and removes everything it had on the host.
	Destroy(ctx context.Context) error
}

// State of a sandbox.
type State string

// States.
const (
	StateRunning State = "running"
	StateStopped State = "stopped"
	// StatePaused: the sandbox's memory, processes and filesystem are
	// saved on the host (Pauser); nothing of it runs until Resume.
	StatePaused State = "paused"
)

// Pauser is a Runtime that pauses sandboxes whole: Pause saves a running
// sandbox's memory and processes to the host's disk beside its writable
// layer and ends its host processes, freeing their CPU and memory; Resume
// brings it back where it was (processes, their memory, open files), with
// its agent answering again. A paused sandbox stays listed (List, Get), its
// State is StatePaused, and its calls (Exec, files, ...) fail with
// ErrNotRunning; it survives a restart of sandboxd (a Runtime made on the
// same state directory finds it paused), and Destroy removes it. Pause of a
// sandbox that is not running and Resume of one that is not paused fail.
type Pauser interface {
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// Mover is a Pauser whose paused sandboxes can be resumed on another host:
// SaveMovable writes a paused sandbox's saved state (its memory, its
// writable layer, what restoring them needs) as regular files into dir,
// which the caller moves (package sandbox: through the blob store);
// RestoreMoved makes sandbox spec.ID from such a dir and runs it, as a
// fork restores a child: its own state directory, container id, cgroup,
// agent socket and network namespace (the restored network stack takes
// the namespace's addresses), the saved processes and memory. The spec's
// base must hold the same files as the saved sandbox's (the same image);
// its Layers are ignored (the saved writable layer holds them), its
// Limits and Hostname must be the saved sandbox's. Both hosts run the same
// runtime build.
type Mover interface {
	Pauser
	SaveMovable(ctx context.Context, id, dir string) error
	RestoreMoved(ctx context.Context, spec Spec, dir string) (Sandbox, error)
}

// Forker is a Runtime that copies a running sandbox whole: Fork starts one
// new sandbox per child spec from the parent's memory, processes and
// filesystem as they were at one moment (a process counting in memory
// goes on counting in each child from the parent's count), while the
// parent runs on. A child is a sandbox like any other: its own id, state
// directory, writable layer (a copy of the parent's), agent session, Env
// (for the processes it starts from then on; the processes copied from
// the parent keep the environment they had) and network namespace. Its
// base, restored layers, limits and hostname are the parent's: the
// child specs' are ignored. A child spec has a Network exactly when the
// parent has one (a restored sandbox cannot gain or lose its link). Fork
// makes all children or none: on error, those it made are destroyed.
type Forker interface {
	Fork(ctx context.Context, parentID string, children []Spec) ([]Sandbox, error)
}

// SaveChecker is a Pauser or Forker that can tell, before anything is
// reserved or made for a pause or a fork, whether it could save sandbox
// id now: an error wrapping ErrCannotPause says why not (a runtime that
// cannot save it at all, or something in it that cannot be saved), the
// sandbox running on as it is. Pause and Fork check again: the sandbox
// may change in between.
type SaveChecker interface {
	CheckSave(ctx context.Context, id string) error
}

// SaveSizer is a Pauser or Forker that bounds what saving the memory of a
// sandbox of limits l writes to the host's disk (a pause's checkpoint, the
// state a fork restores its children from), or says 0 when it knows no
// bound (no memory limit). A save is bounded by what the sandbox may hold,
// not by what it holds now, so that the control plane can reserve that
// much of the node's disk before the save begins.
type SaveSizer interface {
	MaxSaveBytes(l Limits) int64
}

// ForkSpecs checks the child specs of a Fork of a parent with or without
// a network, the same way for every backend.
func ForkSpecs(parentNetwork bool, children []Spec) error {
	if len(children) == 0 {
		return errors.New("fork: no children")
	}
	for _, c := range children {
		if (c.Network != nil) != parentNetwork {
			return fmt.Errorf("fork: child %s: a child has a network exactly when its parent has one", c.ID)
		}
	}
	return nil
}

// Info says what a sandbox runs on.
type Info struct {
	Backend  string // "gvisor"
	Platform string // backend detail, e.g. gVisor's "ptrace"
	Kernel   string // kernel release seen inside
	Agent    string // guest agent version
}

// ExecRequest is a process to run.
type ExecRequest struct {
	Cmd []string
	Env []string // added to the sandbox's Env
	Cwd string   // default /workspace
	// User runs the process as this user of the sandbox (a name in its
	// /etc/passwd); default the agent's own (root).
	User    string
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer // ignored with TTY: a terminal has one output
	Timeout time.Duration
	TTY     bool
	Rows    uint16
	Cols    uint16
	// Resize, when not nil, delivers new window sizes of the TTY while
	// the process runs (a terminal that was resized); without TTY they
	// are ignored. Closing it stops nothing.
	Resize <-chan WindowSize
	// Signal, when not nil, delivers signals for the process's session
	// (the process and what it started) while it runs; closing it stops
	// nothing.
	Signal <-chan syscall.Signal
	// Tag names the process for Attach; unique among the sandbox's running
	// processes (empty: none).
	Tag string
	// Started, when not nil, is told the process's pid once it runs.
	Started func(pid int)
	// Detach leaves the process running when ctx ends (Exec returns the
	// context's error): for a caller that will Attach to it again, such as
	// a server that is shutting down.
	Detach bool
}

// AttachRequest follows a process started earlier.
type AttachRequest struct {
	PID    int
	Tag    string // used instead of PID when set
	Stdout io.Writer
	Stderr io.Writer
	// From says how much of each output stream the caller has already, so
	// that only the rest is sent (as much of it as the agent kept).
	From StreamOffsets
	// Started, when not nil, is told the pid and the offsets at which the
	// output sent begins: past From when the agent no longer had it all.
	Started func(pid int, from StreamOffsets)
	Detach  bool // as ExecRequest.Detach
}

// StreamOffsets count the bytes of a process's output streams since it
// started (a terminal's output counts as Stdout).
type StreamOffsets struct {
	Stdout, Stderr uint64
}

// Process is a process Exec started that still runs.
type Process struct {
	PID     int
	Tag     string
	Cmd     []string
	Cwd     string
	TTY     bool
	Started time.Time
}

// WindowSize is a TTY's size in characters.
type WindowSize struct {
	Rows, Cols uint16
}

// ExecResult is how a process ended.
type ExecResult struct {
	ExitCode  int // exit status, 128+signal when killed
	Signal    int
	TimedOut  bool // killed because Timeout passed
	OOMKilled bool // killed because the sandbox ran out of memory
	Duration  time.Duration
}

// DirEntry is one entry of ListDir.
type DirEntry struct {
	Name    string
	Size    int64
	Mode    fs.FileMode
	ModTime time.Time
	Link    string // symlink target
}

// Stats are a sandbox's resource use.
type Stats struct {
	MemoryBytes int64         // host memory charged to the sandbox
	CPU         time.Duration // CPU time used
	Pids        int64         // host tasks (threads) of the sandbox
	DiskBytes   int64         // bytes used by the writable layers
	Processes   int           // processes inside, as the agent sees them
}

// volumePathPattern is what a volume's mount path may hold: it is given to
// a microVM's init on its kernel command line, where a space or quote
// would end it.
var volumePathPattern = regexp.MustCompile(`^(/[A-Za-z0-9._@+=,-]+)+$`)

// reservedPaths are where a volume may not be mounted, nor below: the
// kernel's and the runtime's own file systems.
var reservedPaths = []string{"/proc", "/sys", "/dev", "/run"}

// CheckVolumePath says why path cannot be a volume's mount path: it must
// be absolute and clean, of letters, digits and ._@+=,- between its
// slashes, and neither "/" nor at or below /proc, /sys, /dev or /run.
func CheckVolumePath(path string) error {
	if !volumePathPattern.MatchString(path) || path != filepath.Clean(path) {
		return fmt.Errorf("volume path %q: want an absolute, clean path of letters, digits and ._@+=,- between its slashes", path)
	}
	for _, r := range reservedPaths {
		if path == r || strings.HasPrefix(path, r+"/") {
			return fmt.Errorf("volume path %q: %s and below are the system's", path, r)
		}
	}
	return nil
}

// CheckVolumes says why vs cannot be mounted: a bad path, two mounts at
// one path or one inside another, or an image that is not a regular file.
func CheckVolumes(vs []VolumeMount) error {
	paths := make([]string, len(vs))
	for i, v := range vs {
		if err := CheckVolumePath(v.Path); err != nil {
			return err
		}
		paths[i] = v.Path
	}
	if err := CheckVolumeOverlap(paths); err != nil {
		return err
	}
	for _, v := range vs {
		if fi, err := os.Stat(v.Image); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("volume image %s: not a regular file", v.Image)
		}
	}
	return nil
}

// CheckVolumeOverlap says which two of paths are one, or one inside the
// other: no two volumes of a sandbox may be.
func CheckVolumeOverlap(paths []string) error {
	for i, p := range paths {
		for _, q := range paths[:i] {
			if p == q || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") {
				return fmt.Errorf("volume paths %q and %q overlap", q, p)
			}
		}
	}
	return nil
}
