// Package gvisor is the runtime backend that runs each sandbox as one gVisor
// (runsc) container: an application kernel in user space that works on any
// Linux host, with no hardware virtualization needed.
//
// What it owns, per sandbox, under Options.StateDir:
//
//	runsc/                  runsc --root: our containers only, never others'
//	bin/sandbox-agent       the agent binary, bind-mounted read-only at /run/sandboxd/bin
//	sandboxes/<cid>/        one directory per container (cid = runsc container id)
//	    meta.json           what the sandbox is (id, spec, limits); written last
//	    bundle/config.json  the OCI bundle
//	    disk.img            the writable layer's ext4 image when a disk limit is set
//	    layer/              mount point of that image (or a plain directory):
//	        lower-N/        restored snapshot layers, read-only overlay lowers
//	        upper/ work/    the sandbox's writable overlay layer
//	    rootfs/             the overlay: base + lowers + upper
//	    sock/agent.sock     the host end of the agent channel (mounted at /run/sandboxd/sock)
//	    hosts               /etc/hosts: sandboxd.internal is 127.0.0.1
//	    checkpoint/         a paused sandbox's saved memory and state (pause.go)
//	ids/<id> -> ../sandboxes/<cid>   the sandbox id, claimed atomically
//
// The container's init is the guest agent (cmd/sandbox-agent). It dials
// sock/agent.sock (runsc --host-uds=open lets a sandbox connect to, never
// create, host sockets) and the host runs the guest protocol over that one
// connection; exec goes through the agent, not `runsc exec` (≈ 1 ms against
// ≈ 40 ms). Any process inside can connect to that socket too, so the
// session is authenticated: the host gives PID 1 alone a per-sandbox secret
// (meta.AgentSecret, in its initial environment, which the agent erases at
// start before any other process exists, and it is not dumpable) and
// accepts only a peer that proves it in the handshake. The agent listens on
// 127.0.0.1:80 inside and forwards each connection over the channel to the
// sandbox's gate (package homegate: per-sandbox connection and request
// limits) in front of Spec.HomeSocket: that is http://sandboxd.internal,
// and the only host endpoint a sandbox reaches (--network=none). A sandbox given a network (Spec.Network, a namespace
// that package netpol made and polices) runs gVisor's netstack on that
// namespace's link instead (--network=sandbox, see network.go); home still
// goes through the agent, not the network.
//
// Limits: runsc applies the bundle's linux.resources to a host cgroup
// (/sandboxd/<cid>) around the sentry and gofer. gVisor has no OOM killer of
// its own, so a host cgroup OOM would kill the whole sandbox; instead a
// watcher fires when memory use reaches Limits.MemoryBytes and has the agent
// kill the biggest process inside, with the cgroup's hard limit a margin
// above as the backstop. Processes inside are capped with RLIMIT_NPROC (which
// gVisor enforces) and CAP_SYS_RESOURCE is not granted, so it cannot be
// raised; the host pids limit is a backstop. Disk: the writable layer lives
// on an ext4 image of Limits.DiskBytes, loop-mounted.
//
// The sandbox runs as root inside (uid 0 of gVisor's user namespace, not the
// host's root), with Docker's default capabilities; /workspace is the default
// working directory.
//
// Which runsc (runsc.go): Options.RunscPath (serve's --runsc,
// SANDBOXD_RUNSC) when named; otherwise BundledRunsc, a current gVisor that
// scripts/install-runsc.sh builds pinned from the Go module proxy, when a
// trial sandbox boots with it; otherwise runsc in PATH (Debian's, December
// 2022). The trials (platform.go, cached per binary and kernel) also pick
// the platform and tell which of the old runsc's workarounds the chosen one
// needs: the statx shim (statxcompat.go), hiding /proc/sys/net for
// --network=sandbox (network.go), and the agent's sending of terminal
// signals (--tty-signals: its terminals turn no ^C into SIGINT; see the
// agent's ttysignals.go). A save trial (saveprobe.go) tells how its
// checkpoint and restore can save a sandbox (pause, fork). Each sandbox
// records the runsc that made it, and later runsc commands on it use that
// one.
//
// Why a current runsc must be built with CGO_ENABLED=0: `go install` on a
// host with a C compiler builds a dynamically linked runsc (interpreter
// /lib64/ld-linux-x86-64.so.2). `runsc boot` and `runsc gofer` pivot_root
// into an empty tmpfs and then re-exec /proc/self/exe (the /proc umounter);
// the kernel finds no ELF interpreter in that root, execve fails with
// ENOENT, and every sandbox dies at boot with "error executing umounter:
// fork/exec /proc/self/exe: no such file or directory", on every platform
// and with any flag. Upstream's release binaries are static. A current
// runsc also differs from Debian's where this backend depends on it: it
// overlays the root filesystem in sandbox memory unless --overlay2=none
// (writes would not reach the host's upper directory), pins an empty
// network namespace for its gofers at <root>/null-netns (a bind mount,
// unmounted on Close), and refuses a guest's open of /proc/1/fd of the
// non-dumpable agent.
package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/renameio/v2"

	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// Name is the backend's name.
const Name = "gvisor"

// Options configure the backend.
type Options struct {
	// StateDir holds everything the backend keeps on the host (see the
	// package doc). Sandboxes found there are re-attached by New.
	StateDir string
	// RunscPath is the runsc binary, used whatever a trial says; empty:
	// BundledRunsc when a trial sandbox boots with it, else runsc in PATH
	// (see chooseRunsc).
	RunscPath string
	// BundledRunsc replaces BundledRunsc as the preferred candidate (tests).
	BundledRunsc string
	// AgentPath is the static sandbox-agent binary; empty: FindAgent.
	AgentPath string
	// Platform is gVisor's platform ("ptrace", "kvm", "systrap"); empty:
	// probe for the fastest that works and cache the answer in StateDir.
	Platform string
	// DefaultLimits fill a Spec's zero limits (zero: host.DefaultLimits).
	DefaultLimits runtime.Limits
	// StartTimeout bounds how long Create waits for the agent (default 20s).
	StartTimeout time.Duration
	// WarmPool keeps this many sandboxes of WarmBaseDir started ahead of
	// time; Create takes one when the spec allows (see Create).
	WarmPool      int
	WarmBaseDir   string
	WarmBaseImage string
	// Prewarm is how many sandboxes started from their owners' layers
	// (runtime.Prewarmer) are kept at most, one per owner.
	Prewarm int
	// MaxSandboxes is how many sandboxes this node runs at most (its
	// capacity; 0: not known). Each sandbox's host pids backstop is at most
	// its share of the host's pid_max and threads-max.
	MaxSandboxes int
	// LogMaxBytes caps each sandbox's agent.log, which the guest can write
	// (0: caplog.DefaultSize).
	LogMaxBytes int64
	// Home limits each sandbox's connections to sandboxd.internal, which
	// its agent forwards from 127.0.0.1:80 (see host.Options).
	Home        homegate.Limits
	HomeMetrics *homegate.Metrics
	Logger      *slog.Logger
}

// Runtime is the gVisor backend. It implements runtime.Runtime.
type Runtime struct {
	// Base holds the state directory and the containers attached, and
	// serves Get and List.
	*host.Base[*sandbox]
	opts Options
	log  *slog.Logger
	// runsc is the binary new sandboxes run on; legacyRunsc the one that
	// made those whose meta does not say (see legacyRunsc).
	runsc       RunscInfo
	legacyRunsc string
	platform    string
	rejected    map[string]string
	// networkError says why sandboxes with a network cannot start on
	// this runsc ("" when they can: see probeResult).
	networkError string
	// pidsCeiling caps each sandbox's host pids backstop (hostTaskCeiling).
	pidsCeiling int64
	// preload is the host file mounted as /etc/ld.so.preload, naming the
	// statx shim; "" when the shim could not be built.
	preload string

	// saves are the save trials' answers, by runsc binary (saveprobe.go).
	saves saveProbes

	pool *pool // set once, by New
	// prewarmed are the sandboxes started from their owners' layers
	// ahead of their creates (Options.Prewarm).
	prewarmed *host.Prewarmed[*sandbox]
	// pools are the sandboxes started ahead for other specs than the warm
	// pool's: custom templates' (runtime.Pooler).
	pools *host.Pools[*sandbox]
}

var (
	_ runtime.Runtime   = (*Runtime)(nil)
	_ runtime.Prewarmer = (*Runtime)(nil)
	_ runtime.Pooler    = (*Runtime)(nil)
	_ runtime.Pauser    = (*Runtime)(nil)
)

// New prepares the state directory, picks the platform and re-attaches the
// sandboxes an earlier process left running. It needs root.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	// The options every backend takes, with this one's defaults.
	common := host.Options{StateDir: opts.StateDir, DefaultLimits: opts.DefaultLimits, StartTimeout: opts.StartTimeout, LogMaxBytes: opts.LogMaxBytes, Home: opts.Home, HomeMetrics: opts.HomeMetrics, Logger: opts.Logger}
	b, err := host.NewBase[*sandbox](ctx, Name, "mounts, cgroups, runsc", common, host.Options{StartTimeout: 20 * time.Second}, "runsc", "bin")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(b.StateDir(), "bin")
	// Every user inside reaches it (/run/sandboxd/bin, read-only): the
	// statx shim each process preloads and the agent binary the
	// tty-session helper of a user's terminal runs from. Nothing in it
	// is secret.
	if err := os.Chmod(bin, 0o755); err != nil {
		b.Abort()
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	removeTrialDirs(b.StateDir())
	agentPath, err := host.FindAgent(opts.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	if err := installAgent(agentPath, filepath.Join(bin, "sandbox-agent")); err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	r := &Runtime{Base: b, opts: opts, log: b.Log(), pidsCeiling: hostTaskCeiling(opts.MaxSandboxes)}
	pr, err := r.chooseRunsc(ctx)
	if err != nil {
		b.Abort()
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	r.platform, r.rejected, r.networkError = pr.Platform, pr.Rejected, pr.NetworkError
	r.legacyRunsc = legacyRunsc(opts, r.runsc.Path)
	if pr.StatxShim {
		if r.preload, err = installStatxShim(ctx, bin); err != nil {
			r.log.Warn("gvisor runtime: running without the statx shim; coreutils ls and stat fail on this runsc", "err", err)
			r.preload = ""
		}
	}
	r.log.Info("gvisor runtime ready", "runsc", r.runsc.Path, "runsc_version", r.runsc.Version, "why", r.runsc.Reason,
		"runsc_rejected", r.runsc.Rejected, "platform", r.platform, "platform_rejected", r.rejected,
		"statx_shim", r.preload != "", "netns_workaround", r.runsc.NetnsWorkaround, "agent_tty_signals", r.runsc.NoTTYSignals,
		"host_pids_per_sandbox", r.pidsCeiling)
	for _, d := range r.Degraded() {
		r.log.Warn("gvisor runtime degraded", "what", d.Summary, "why", d.Detail)
	}
	if err := r.reattach(ctx); err != nil {
		b.Abort()
		return nil, err
	}
	r.trySavesAhead()
	r.prewarmed = host.NewPrewarmed(opts.Prewarm, func(ctx context.Context, spec runtime.Spec) (*sandbox, error) {
		return r.createCold(ctx, spec, "")
	})
	r.pools = host.NewPools(r.Context(), r.log, func(ctx context.Context, spec runtime.Spec) (*sandbox, error) {
		return r.createCold(ctx, spec, "")
	}, r.complete)
	if opts.WarmPool > 0 && opts.WarmBaseDir != "" {
		r.pool = newPool(r, opts.WarmPool)
	}
	return r, nil
}

// FindAgent looks for the sandbox-agent binary next to the running
// executable, then in PATH.
func FindAgent() (string, error) { return host.FindAgent("") }

// installAgent copies the agent into the state dir (atomically, so running
// sandboxes never see a partial binary) unless an identical copy is there.
func installAgent(src, dst string) error {
	want, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read agent %s: %w", src, err)
	}
	if have, err := os.ReadFile(dst); err == nil && bytes.Equal(have, want) {
		return nil
	}
	if err := renameio.WriteFile(dst, want, 0o755); err != nil {
		return fmt.Errorf("install agent: %w", err)
	}
	return nil
}

// Capabilities implements runtime.Runtime: networks through gVisor's
// netstack in the sandbox's namespace; memory snapshots with runsc
// checkpoint and restore (Pause, Resume).
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Network: true, MemorySnapshot: true, AnyRootFS: true}
}

// Platform is the gVisor platform in use; Rejected says why the faster ones
// were not chosen.
func (r *Runtime) Platform() (string, map[string]string) { return r.platform, r.rejected }

// Runsc says which runsc binary new sandboxes run on and why.
func (r *Runtime) Runsc() RunscInfo { return r.runsc }

// Describe is the runtime in one line, for GET /api/health.
func (r *Runtime) Describe() string {
	// Public (GET /api/health answers it): the version, never a host path.
	return fmt.Sprintf("%s %s, runsc %s", Name, r.platform, r.runsc.Version)
}

// Close releases the Runtime: agent connections, watchers and the warm pool
// (whose sandboxes are destroyed). Created sandboxes keep running and a new
// Runtime on the same StateDir finds them.
func (r *Runtime) Close() error {
	return r.Shutdown(func() error {
		r.saves.stopAhead()
		err := errors.Join(r.prewarmed.Close(), r.pools.Close())
		if r.pool != nil {
			err = errors.Join(err, r.pool.close())
		}
		// So that the state dir can be removed once its sandboxes are.
		unmountNullNetns(filepath.Join(r.StateDir(), "runsc"))
		return err
	})
}

// Create implements runtime.Runtime. It hands out a sandbox started ahead
// when one fits: the owner's prewarmed sandbox when its spec would have
// made it (the same layers restored, see runtime.PrewarmKey), one of the
// pool of its spec's key (a custom template's, see runtime.PoolKey), or,
// with no layers, the default limits, the warm pool's base and no custom
// hostname, a warm one (its writable layer is still empty, so nothing else
// needs doing). Otherwise it creates one cold: restored layers become
// overlay lowers, and they cannot be added under a running overlay.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := r.Check(&spec); err != nil {
		return nil, err
	}
	link := r.Table().Dir.Path(spec.ID)
	if s, ok := r.prewarmed.Take(ctx, spec); ok {
		if s, err := r.hand(ctx, s, spec, link); s != nil || err != nil {
			return s, err
		}
	}
	if s, ok := r.pools.Take(ctx, spec); ok {
		if s, err := r.hand(ctx, s, spec, link); s != nil || err != nil {
			return s, err
		}
	}
	if p := r.pool; p != nil && p.fits(spec) {
		if s := p.take(); s != nil {
			if s, err := r.hand(ctx, s, spec, link); s != nil || err != nil {
				return s, err
			}
		}
	}
	return r.createCold(ctx, spec, link)
}

// hand turns a sandbox started ahead (warm or prewarmed) into spec's. When
// that fails for any reason but the id being taken, it returns neither a
// sandbox nor an error: the caller creates one cold.
func (r *Runtime) hand(ctx context.Context, s *sandbox, spec runtime.Spec, link string) (*sandbox, error) {
	err := s.assign(spec, link)
	if err == nil {
		return s, nil
	}
	_ = s.Destroy(context.WithoutCancel(ctx))
	if errors.Is(err, runtime.ErrExists) {
		return nil, err
	}
	r.log.Warn("assign a sandbox started ahead failed; creating cold", "id", spec.ID, "err", err)
	return nil, nil
}

// Prewarm implements runtime.Prewarmer: it starts a sandbox of spec (its
// layers restored, nothing else in it) for spec.Owner and keeps it, up to
// want of them and within Options.Prewarm in all, for that owner's next
// Creates with the same layers.
func (r *Runtime) Prewarm(ctx context.Context, spec runtime.Spec, want int) (bool, error) {
	if spec.BaseDir == "" {
		return false, errors.New("prewarm: BaseDir is required")
	}
	spec.Limits = r.Limits(spec.Limits)
	if spec.Hostname == "" {
		spec.Hostname = "sandbox"
	}
	// It ends with the runtime too: Close waits for the prewarms under way.
	ctx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(r.Context(), cancel)()
	defer cancel()
	return r.prewarmed.Prewarm(ctx, spec, want)
}

// DropPrewarmed implements runtime.Prewarmer.
func (r *Runtime) DropPrewarmed(ctx context.Context, owner string) error {
	return r.prewarmed.Drop(ctx, owner)
}

// PrewarmStats implements runtime.Prewarmer.
func (r *Runtime) PrewarmStats() runtime.PrewarmStats { return r.prewarmed.Stats() }

// SetPool implements runtime.Pooler.
func (r *Runtime) SetPool(name string, size int, open func(ctx context.Context) (runtime.Spec, func(), error)) {
	r.pools.Set(name, size, open)
}

// PoolStats implements runtime.Pooler.
func (r *Runtime) PoolStats() runtime.PoolReport {
	rep := r.pools.Stats()
	if p := r.pool; p != nil {
		rep.Warm = p.stats()
	}
	return rep
}

// complete fills spec's defaults as Check does for a Create.
func (r *Runtime) complete(spec *runtime.Spec) {
	spec.Limits = r.Limits(spec.Limits)
	if spec.Hostname == "" {
		spec.Hostname = "sandbox"
	}
}

// createCold builds and starts a sandbox for spec. link, when not empty, is
// the ids/ entry to claim for it.
func (r *Runtime) createCold(ctx context.Context, spec runtime.Spec, link string) (*sandbox, error) {
	cid := host.NewCID("sbx-")
	dir := r.Table().Dir.SandboxDir(cid)
	if link != "" {
		if err := r.Table().Dir.Claim(spec.ID, cid); err != nil {
			return nil, err
		}
	}
	m := meta{Record: host.NewRecord(spec, cid), Platform: r.platform, Runsc: r.runsc.Path, AgentTTYSignals: r.runsc.NoTTYSignals}
	s := newSandbox(r, dir, m)
	return r.Made(ctx, spec.ID, link, s, s.create(ctx, spec.Layers))
}

// reattach finds the sandboxes of an earlier process: those with an id are
// served again (their agents dial back in), unclaimed warm ones and
// half-made ones are destroyed.
func (r *Runtime) reattach(ctx context.Context) error {
	return host.Reattach(ctx, r.Table().Dir, r.log, host.Backend[meta]{
		Blank:   blankMeta,
		Destroy: func(ctx context.Context, dir string, m meta) error { return newSandbox(r, dir, m).Destroy(ctx) },
		Serve: func(_ context.Context, dir string, m meta) {
			s := newSandbox(r, dir, m)
			if m.Paused && !m.Stopped {
				// Nothing of it runs, no agent will dial: it is only
				// served (State, Resume, Destroy) until Resume attaches.
				r.Table().Put(m.CID, s)
				return
			}
			s.thaw(ctx)
			if err := s.attach(); err != nil {
				r.log.Warn("re-attach sandbox", "id", m.ID, "err", err)
				return
			}
			s.startGuard()
		},
	})
}

// runscWith builds an invocation of the runsc at path, which must be the
// one that made the containers it acts on: runsc versions need not read
// each other's state files.
func (r *Runtime) runscWith(ctx context.Context, path, platform, network string, args ...string) *exec.Cmd {
	global := []string{
		"--root", filepath.Join(r.StateDir(), "runsc"),
		"--platform", platform,
		"--network", network,
		// A current runsc overlays the root filesystem in the sandbox's
		// own memory by default (root:self): writes would never reach the
		// host's upper directory, which snapshots, the disk limit and
		// re-attach rely on. Debian's runsc had it off.
		"--overlay2", "none",
		"--host-uds", "open",
		"--cpu-num-from-quota",
	}
	if network == "sandbox" && r.runsc.NetnsWorkaround {
		return sandboxNetCmd(ctx, path, append(global, args...))
	}
	return exec.CommandContext(ctx, path, append(global, args...)...)
}

// runscFor builds an invocation of the runsc (and platform) that made the
// sandbox m describes.
func (r *Runtime) runscFor(ctx context.Context, m meta, network string, args ...string) *exec.Cmd {
	path, platform := m.Runsc, m.Platform
	if path == "" {
		path = r.legacyRunsc
	}
	if platform == "" {
		platform = r.platform
	}
	return r.runscWith(ctx, path, platform, network, args...)
}

// runscRun runs a runsc subcommand on the sandbox m describes, with the
// runsc that made it, and returns its stdout.
func (r *Runtime) runscRun(ctx context.Context, m meta, args ...string) ([]byte, error) {
	cmd := r.runscFor(ctx, m, "none", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// meta is what the state directory records about a sandbox.
type meta struct {
	host.Record
	Platform string `json:"platform"`
	// Runsc is the runsc binary that made the container (empty: made
	// before sandboxd chose among several; see legacyRunsc).
	Runsc string `json:"runsc,omitempty"`
	Disk  bool   `json:"disk,omitempty"` // layer/ is a loop-mounted image
	// AgentSecret (hex) is the key the sandbox's agent proves it holds in
	// the handshake; only PID 1 is given it (see buildSpec). Empty for a
	// sandbox made before sessions were authenticated.
	AgentSecret string `json:"agent_secret,omitempty"`
	// Paused: the container was checkpointed into checkpoint/ and its
	// processes ended (Pause); Resume restores it.
	Paused bool `json:"paused,omitempty"`
	// AgentTTYSignals: its agent runs with --tty-signals (its runsc's
	// terminals send no signals). Kept with the sandbox, as its agent's
	// arguments are: a restore checks the bundle against the saved one.
	AgentTTYSignals bool `json:"agent_tty_signals,omitempty"`
}

// Halted implements host.Recorded: a paused sandbox has no agent either,
// and none will dial in before Resume.
func (m meta) Halted() bool { return m.Stopped || m.Paused }

// blankMeta is enough of a meta to destroy the sandbox cid.
func blankMeta(cid string) meta { return meta{Record: host.BlankRecord(cid)} }

func writeMeta(dir string, m meta) error { return host.WriteMeta(dir, m) }
