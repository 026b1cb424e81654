// Package microvm is the runtime backend that runs each sandbox as a QEMU
// microVM: the microvm machine (virtio-mmio, no PCI, no ACPI, no firmware
// beyond qboot), the minimal guest kernel of internal/kernel booted as a
// PVH vmlinux, and the guest agent (cmd/sandbox-agent) as the kernel's init,
// speaking the guest protocol over a virtio-serial port. On hosts where KVM
// works it is a hardware boundary; elsewhere QEMU emulates the CPU (TCG),
// which is slow but keeps the same boundary of a separate kernel.
//
// What it owns, under Options.StateDir:
//
//	boot/vmlinux, boot/initrd-<hash>.cpio   the kernel and the agent's initramfs
//	bases/<key>.ext4, <key>.src             read-only base disks made from Spec.BaseDir
//	                                        (see baseDisk), and the directory each is of
//	accel.json                              the accelerator probe's cached answer
//	templates/<key>/                        booted VMs saved as memory snapshots
//	sandboxes/<cid>/                        one directory per VM (cid = "vm-<hex>")
//	    meta.json                           what the sandbox is; written last
//	    qemu.log, console.log               QEMU's own messages and the guest's console, capped
//	    qemu.fifo                           the pipe QEMU writes qemu.log into
//	    memory.state                        the VM's memory while paused
//	    jail/                               QEMU's chroot (see jail.go), holding
//	        disk/layer.ext4                 the writable layer disk
//	        run/{qmp,agent,console}.sock
//	ids/<id> -> ../sandboxes/<cid>          the sandbox id, claimed atomically
//
// The guest's file system: the base disk (ext4, read-only, shared by all
// VMs of a base; any directory can be one, a custom template's unpacked
// OCI image too: the guest's init and agent are the initramfs's) and the layer disk (ext4 of Limits.DiskBytes holding the
// restored layers as lower-N/, and upper/ and work/) under overlayfs,
// assembled by the agent's vm-init. Snapshot asks the agent to stream
// upper/ in the snapshot format — the guest kernel reads its own file
// system, so the host never mounts a disk a guest has written. A stopped
// sandbox is booted again for that, with nothing but the agent running.
//
// Limits: the guest gets Limits.MemoryBytes plus room for its kernel and
// agent, and ceil(Limits.CPUs) vCPUs; inside, a cgroup holds the sandbox's
// processes to Limits.MemoryBytes and Limits.Pids (the guest's OOM killer
// picks among them, never the agent). Outside, QEMU's host cgroup caps CPU
// time at Limits.CPUs and memory at the guest's plus QEMU's own, as a
// backstop. Disk: the layer disk's size. Stats.MemoryBytes is the memory
// the guest charges to the sandbox's processes (what the limit bounds); the
// VMM's own footprint comes on top.
//
// Speed: a VM started from a template — a booted VM of the same base and
// limits saved with QMP migrate — is restored with -incoming instead of
// booted (Options.Template). The sandbox's clock is set and its RNG
// reseeded from the host after every restore, so clones never share
// randomness.
package microvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/kernel"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// Name is the backend's name.
const Name = "microvm"

// Options configure the backend.
type Options struct {
	// StateDir holds everything the backend keeps on the host (see the
	// package doc). Sandboxes found there are re-attached by New.
	StateDir string
	// QEMUPath is qemu-system-x86_64; empty: looked up in PATH.
	QEMUPath string
	// KernelPath is the guest vmlinux; empty: the kernel built by
	// internal/kernel in CacheDir (`sandboxd kernel build`; default: the
	// user cache dir's sandboxd/, as for sandboxd --cache-dir).
	KernelPath string
	CacheDir   string
	// AgentPath is the static sandbox-agent binary; empty: FindAgent.
	AgentPath string
	// Accel is "kvm" or "tcg"; empty: probe (KVM if a probe VM boots on
	// it) and cache the answer in StateDir.
	Accel string
	// DefaultLimits fill a Spec's zero limits (zero: host.DefaultLimits).
	DefaultLimits runtime.Limits
	// UIDBase is the first of 65536 host uids given to QEMU processes, one
	// per sandbox (default 1900000000). They need no passwd entries.
	UIDBase int
	// Template, when BaseDir is set, keeps a booted VM of that base with
	// the default limits as a memory snapshot; Create restores from it
	// when the spec fits (no layers, default limits and hostname).
	Template TemplateOptions
	// StartTimeout bounds how long Create waits for the agent (default 90s:
	// a TCG boot on a loaded host takes seconds).
	StartTimeout time.Duration
	// LogMaxBytes caps each sandbox's console log and qemu.log, which the
	// guest can fill (0: caplog.DefaultSize).
	LogMaxBytes int64
	// Home limits each sandbox's connections to sandboxd.internal, which
	// its agent forwards over the agent port (see host.Options).
	Home        homegate.Limits
	HomeMetrics *homegate.Metrics
	Logger      *slog.Logger
}

// TemplateOptions name the base a memory-snapshot template is made of.
type TemplateOptions struct {
	BaseDir   string
	BaseImage string
}

// Runtime is the microVM backend. It implements runtime.Runtime.
type Runtime struct {
	*host.Base[*sandbox] // the state directory, the VMs attached; Get and List
	opts                 Options
	log                  *slog.Logger
	qemu                 string
	qemuVersion          string
	kernel               string // in StateDir/boot
	initrd               string
	accel                string
	rejected             string // why KVM is not used
	tscKHz               uint64

	baseMu   sync.Mutex
	bases    map[string]string     // base dir -> disk
	building map[string]*baseBuild // base dir -> its disk being made

	mu   sync.Mutex     // guards uids
	uids map[int]string // uid -> cid
	tmpl *templates     // set once, by New
}

var (
	_ runtime.Runtime = (*Runtime)(nil)
	_ runtime.Pauser  = (*Runtime)(nil)
)

// New prepares the state directory, probes the accelerator and re-attaches
// the sandboxes an earlier process left running. It needs root.
func New(ctx context.Context, opts Options) (*Runtime, error) {
	if opts.UIDBase <= 0 {
		opts.UIDBase = 1_900_000_000
	}
	// A TCG boot on a loaded host takes seconds.
	defaults := host.Options{StartTimeout: 90 * time.Second}
	b, err := host.NewBase[*sandbox](ctx, Name, "jails, cgroups", host.Options{StateDir: opts.StateDir, DefaultLimits: opts.DefaultLimits, StartTimeout: opts.StartTimeout, LogMaxBytes: opts.LogMaxBytes, Home: opts.Home, HomeMetrics: opts.HomeMetrics, Logger: opts.Logger}, defaults, "boot", "bases", "templates")
	if err != nil {
		return nil, err
	}
	state := b.StateDir()
	r := &Runtime{Base: b, opts: opts, log: b.Log(), bases: map[string]string{}, building: map[string]*baseBuild{}, uids: map[int]string{}}
	if r.qemu, err = findQEMU(opts.QEMUPath); err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, r.qemu, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: %s --version: %w", r.qemu, err)
	}
	r.qemuVersion = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	kpath := opts.KernelPath
	if kpath == "" && opts.CacheDir == "" {
		// sandboxd's default --cache-dir.
		d, err := os.UserCacheDir()
		if err != nil {
			return nil, fmt.Errorf("microvm runtime: no KernelPath or CacheDir: %w", err)
		}
		opts.CacheDir = filepath.Join(d, "sandboxd")
	}
	if kpath == "" {
		k, err := kernel.NewStore(opts.CacheDir, b.Log()).Lookup("")
		if err != nil {
			return nil, fmt.Errorf("microvm runtime: guest kernel: %w", err)
		}
		kpath = k.Path
	}
	if r.kernel, err = installFile(kpath, filepath.Join(state, "boot")); err != nil {
		return nil, fmt.Errorf("microvm runtime: install kernel: %w", err)
	}
	agentPath, err := host.FindAgent(opts.AgentPath)
	if err != nil {
		return nil, fmt.Errorf("microvm runtime: %w", err)
	}
	if r.initrd, err = buildInitrd(agentPath, filepath.Join(state, "boot")); err != nil {
		return nil, fmt.Errorf("microvm runtime: %w", err)
	}
	r.tscKHz = tscKHz()
	if r.accel, r.rejected, err = r.chooseAccel(ctx); err != nil {
		b.Abort()
		return nil, fmt.Errorf("microvm runtime: %w", err)
	}
	if r.rejected != "" {
		r.log.Info("KVM not used; running VMs under TCG (software emulation, slow)", "reason", r.rejected)
	}
	r.log.Info("microvm runtime ready", "qemu", r.qemuVersion, "accel", r.accel, "kernel", r.kernel, "tsc_khz", r.tscKHz)
	if err := r.reattach(ctx); err != nil {
		b.Abort()
		return nil, err
	}
	r.pruneBases("")
	if opts.Template.BaseDir != "" {
		r.tmpl = newTemplates(r)
	}
	return r, nil
}

func findQEMU(p string) (string, error) {
	if p == "" {
		var err error
		if p, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return "", fmt.Errorf("microvm runtime: qemu-system-x86_64 not found (apt-get install qemu-system-x86): %w", err)
		}
	}
	return filepath.Abs(p)
}

// installFile copies src into dir under a name derived from its content
// identity (so running VMs keep theirs when it changes), read-only.
func installFile(src, dir string) (string, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(dir, fmt.Sprintf("%s-%d-%d", filepath.Base(src), fi.Size(), fi.ModTime().Unix()))
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	if err := renameio.WriteFile(dst, b, 0o444); err != nil {
		return "", fmt.Errorf("install %s: %w", src, err)
	}
	return dst, nil
}

// FindAgent looks for the sandbox-agent binary next to the running
// executable, then in PATH.
func FindAgent() (string, error) { return host.FindAgent("") }

// Capabilities implements runtime.Runtime: sandbox networks (a tap in the
// sandbox's namespace, network.go), memory snapshots (templates, pause
// and resume, fork) and any root filesystem: Spec.BaseDir may be any
// unpacked image (a custom template's), which gets a base disk of its own
// (baseDisk) and boots with the agent from the initramfs, needing neither
// an init nor the agent in the image.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Network: true, MemorySnapshot: true, AnyRootFS: true}
}

// Accel is the accelerator in use ("kvm" or "tcg") and, for TCG, why KVM
// was rejected.
func (r *Runtime) Accel() (string, string) { return r.accel, r.rejected }

// Close releases the Runtime: agent connections and templates. Created
// sandboxes keep running and a new Runtime on the same StateDir finds them.
func (r *Runtime) Close() error {
	return r.Shutdown(func() error {
		if r.tmpl != nil {
			return r.tmpl.close()
		}
		return nil
	})
}

var (
	hostnamePattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$`)
)

// Create implements runtime.Runtime. A spec that fits the template (no
// layers, default limits and hostname, the template's base) is restored
// from its memory snapshot when one is ready; anything else boots cold.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := r.Check(&spec); err != nil {
		return nil, err
	}
	if err := checkNetwork(spec.Network); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	if !hostnamePattern.MatchString(spec.Hostname) {
		return nil, fmt.Errorf("create sandbox %s: invalid hostname %q", spec.ID, spec.Hostname)
	}
	link := r.Table().Dir.Path(spec.ID)
	if t := r.tmpl; t != nil && t.fits(spec) {
		if tp := t.ready(); tp != nil {
			s, err := r.createFromTemplate(ctx, spec, link, tp)
			if err == nil || errors.Is(err, runtime.ErrExists) {
				return s, err
			}
			r.log.Warn("restore from template failed; booting cold", "id", spec.ID, "err", err)
		}
	}
	return r.createCold(ctx, spec, link)
}

func newCID() string { return host.NewCID("vm-") }

// claim reserves the id link and a uid for a new sandbox.
func (r *Runtime) claim(id, cid, link string) (int, error) {
	if link != "" {
		if err := r.Table().Dir.Claim(id, cid); err != nil {
			return 0, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid := r.opts.UIDBase; uid < r.opts.UIDBase+65536; uid++ {
		if _, used := r.uids[uid]; !used {
			r.uids[uid] = cid
			return uid, nil
		}
	}
	if link != "" {
		_ = os.Remove(link)
	}
	return 0, fmt.Errorf("create sandbox %s: no free uid in the jail range", id)
}

func (r *Runtime) releaseUID(uid int, cid string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.uids[uid] == cid {
		delete(r.uids, uid)
	}
}

// newMeta is the meta of a new sandbox of spec.
func (r *Runtime) newMeta(spec runtime.Spec, cid string, uid int) meta {
	return meta{Record: host.NewRecord(spec, cid), UID: uid, Accel: r.accel}
}

// createCold makes the sandbox's disks and boots it. link, when not empty,
// is the ids/ entry to claim for it.
func (r *Runtime) createCold(ctx context.Context, spec runtime.Spec, link string) (*sandbox, error) {
	cid := newCID()
	uid, err := r.claim(spec.ID, cid, link)
	if err != nil {
		return nil, err
	}
	s := newSandbox(r, r.Table().Dir.SandboxDir(cid), r.newMeta(spec, cid, uid))
	return r.Made(ctx, spec.ID, link, s, s.create(ctx, spec.Layers))
}

func (r *Runtime) get(id string) (*sandbox, error) { return r.Table().Get(id) }

// reattach finds the sandboxes of an earlier process: those with an id are
// served again (running VMs are reconnected; VMs that died meanwhile are
// marked stopped, their disks kept), the rest (half-made, template
// builders) are destroyed.
func (r *Runtime) reattach(ctx context.Context) error {
	return host.Reattach(ctx, r.Table().Dir, r.log, host.Backend[meta]{
		Blank:   blankMeta,
		Destroy: func(ctx context.Context, dir string, m meta) error { return newSandbox(r, dir, m).Destroy(ctx) },
		Serve: func(ctx context.Context, dir string, m meta) {
			r.mu.Lock()
			r.uids[m.UID] = m.CID
			r.mu.Unlock()
			s := newSandbox(r, dir, m)
			if !m.Stopped && !m.Paused && !alive(m.PID, m.PIDStart) {
				r.log.Warn("sandbox's VM died while sandboxd was away; marking it stopped", "id", m.ID)
				if err := s.Stop(ctx); err != nil {
					r.log.Warn("stop dead sandbox", "id", m.ID, "err", err)
				}
			}
			s.attach()
			if m := s.Meta(); !m.Stopped && !m.Paused {
				s.startLogs(m.PID, m.PIDStart)
			}
		},
	})
}

// meta is what the state directory records about a sandbox.
type meta struct {
	host.Record
	UID      int         `json:"uid"`
	Accel    string      `json:"accel"`
	VM       vmConfig    `json:"vm"`
	PID      int         `json:"pid,omitempty"`
	PIDStart uint64      `json:"pid_start,omitempty"`
	Template string      `json:"template,omitempty"` // restored from this template
	Paused   bool        `json:"paused,omitempty"`   // memory saved in memory.state
	Hello    guest.Hello `json:"hello,omitempty"`    // what the paused agent waits to have answered
}

// Halted implements host.Recorded: a paused sandbox has no agent either
// until it is resumed.
func (m meta) Halted() bool { return m.Stopped || m.Paused }

// blankMeta is enough of a meta to destroy the sandbox cid.
func blankMeta(cid string) meta { return meta{Record: host.BlankRecord(cid)} }

func writeMeta(dir string, m meta) error { return host.WriteMeta(dir, m) }

// PID is the host pid of a sandbox's QEMU, 0 when it does not run (for
// tests and diagnostics).
func PID(sb runtime.Sandbox) int {
	s, ok := sb.(*sandbox)
	if !ok {
		return 0
	}
	m := s.Meta()
	if !alive(m.PID, m.PIDStart) {
		return 0
	}
	return m.PID
}
