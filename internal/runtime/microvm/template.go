package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// Memory snapshots. A VM is "parked" by closing the host's agent session,
// connecting again and reading the agent's fresh Hello without answering
// it, then stopping the VM and saving its state with QMP migrate to a file;
// QEMU then quits. Restoring starts QEMU with -incoming from that file and
// answers the saved Hello on a new connection (guest.Resume), so the
// restored agent's session starts cleanly. Templates are parked VMs that
// new sandboxes are cloned from (memory state plus a copy of the layer
// disk as it was when saved); Pause and Resume park and restore one
// sandbox in place.

// template is a parked VM new sandboxes are restored from.
type template struct {
	Key      string         `json:"key"`
	BaseDir  string         `json:"base_dir"`
	Limits   runtime.Limits `json:"limits"`
	Hostname string         `json:"hostname"`
	VM       vmConfig       `json:"vm"`
	Hello    guest.Hello    `json:"hello"`
	// Layers are the restored layers the VM's disk holds (a fork's
	// parent's; none for a template).
	Layers []string `json:"layers,omitempty"`
	// Linked: the saved guest's link is configured (a fork's parent with
	// a network); a template's is down.
	Linked  bool      `json:"linked,omitempty"`
	Created time.Time `json:"created"`
	dir     string
	// mem, when set, is where the memory state is instead of dir (a
	// fork's: its parent's, where Resume finds it).
	mem string
}

func (t *template) state() string {
	if t.mem != "" {
		return t.mem
	}
	return filepath.Join(t.dir, "memory.state")
}
func (t *template) layer() string { return filepath.Join(t.dir, "layer.ext4") }

// templates builds the template of Options.Template in the background and
// hands it out.
type templates struct {
	r      *Runtime
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	cur *template
}

func newTemplates(r *Runtime) *templates {
	ctx, cancel := context.WithCancel(r.Context())
	t := &templates{r: r, cancel: cancel, done: make(chan struct{})}
	go t.build(ctx)
	return t
}

// spec is what template VMs are made of.
func (t *templates) spec() runtime.Spec {
	o := t.r.opts.Template
	return runtime.Spec{BaseDir: o.BaseDir, BaseImage: o.BaseImage, Limits: t.r.Limits(runtime.Limits{}), Hostname: "sandbox"}
}

// fits says whether a template VM can become spec's sandbox: its disk
// size, memory, vCPUs, hostname and guest cgroup limits were fixed when it
// booted, and restored layers are overlay lowers mounted at boot.
func (t *templates) fits(spec runtime.Spec) bool {
	w := t.spec()
	return len(spec.Layers) == 0 && len(spec.Volumes) == 0 && spec.BaseDir == w.BaseDir && spec.Limits == w.Limits && spec.Hostname == w.Hostname
}

// ready returns the template once it is built.
func (t *templates) ready() *template {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cur
}

// key identifies a template: what went into the VM and its snapshot.
func (t *templates) key() string {
	w := t.spec()
	h := sha256.New()
	// "nic": templates made before VMs had a NIC do not fit the restores.
	fmt.Fprintf(h, "nic\n%s\n%+v\n%s\n%s\n%s\n%s\n%s\n%d\n", w.BaseDir, w.Limits, w.Hostname, t.r.qemuVersion, t.r.kernel, t.r.initrd, t.r.accel, t.r.tscKHz)
	if fp, err := fingerprint(w.BaseDir); err == nil {
		h.Write([]byte(fp))
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

func (t *templates) build(ctx context.Context) {
	defer close(t.done)
	key := t.key()
	dir := filepath.Join(t.r.StateDir(), "templates", key)
	if tp, err := loadTemplate(dir); err == nil {
		t.mu.Lock()
		t.cur = tp
		t.mu.Unlock()
		return
	}
	// Older templates (another base, kernel or agent) are of no use.
	if olds, _ := filepath.Glob(filepath.Join(t.r.StateDir(), "templates", "*")); len(olds) > 0 {
		for _, o := range olds {
			_ = os.RemoveAll(o)
		}
	}
	backoff := host.Backoff{First: 5 * time.Second, Max: 5 * time.Minute}
	for ctx.Err() == nil {
		start := time.Now()
		tp, err := t.r.makeTemplate(ctx, t.spec(), dir, key)
		if err == nil {
			t.r.log.Info("memory-snapshot template ready", "base", tp.BaseDir, "elapsed", time.Since(start).Round(time.Millisecond))
			t.mu.Lock()
			t.cur = tp
			t.mu.Unlock()
			return
		}
		if ctx.Err() != nil {
			return
		}
		t.r.log.Warn("build memory-snapshot template", "err", err)
		if !backoff.Wait(ctx) {
			return
		}
	}
}

func (t *templates) close() error {
	t.cancel()
	<-t.done
	return nil
}

func loadTemplate(dir string) (*template, error) {
	b, err := os.ReadFile(filepath.Join(dir, "template.json"))
	if err != nil {
		return nil, err
	}
	var tp template
	if err := json.Unmarshal(b, &tp); err != nil {
		return nil, err
	}
	tp.dir = dir
	for _, f := range []string{tp.state(), tp.layer()} {
		if _, err := os.Stat(f); err != nil {
			return nil, err
		}
	}
	return &tp, nil
}

// makeTemplate boots a VM of spec, parks it into dir and removes the VM.
func (r *Runtime) makeTemplate(ctx context.Context, spec runtime.Spec, dir, key string) (*template, error) {
	s, err := r.createCold(ctx, spec, "")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := s.Destroy(context.WithoutCancel(ctx)); err != nil {
			r.log.Warn("remove template builder VM", "err", err)
		}
	}()
	tmp := dir + ".tmp"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	tp := &template{Key: key, BaseDir: spec.BaseDir, Limits: spec.Limits, Hostname: spec.Hostname, VM: s.Meta().VM, Created: time.Now().UTC(), dir: tmp}
	s.OpMu.Lock()
	tp.Hello, err = s.park(ctx, tp.state())
	s.OpMu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := host.CopySparse(s.jail("disk", "layer.ext4"), tp.layer(), 0o600); err != nil {
		return nil, err
	}
	b, err := json.MarshalIndent(tp, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "template.json"), b, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	tp.dir = dir
	return tp, nil
}

// createFromTemplate makes spec's sandbox from a copy of the template's
// layer disk and its memory (a template's, or a fork's parent's: Fork).
func (r *Runtime) createFromTemplate(ctx context.Context, spec runtime.Spec, link string, tp *template) (*sandbox, error) {
	cid := newCID()
	uid, err := r.claim(spec.ID, cid, link)
	if err != nil {
		return nil, err
	}
	m := r.newMeta(spec, cid, uid)
	m.VM, m.Template, m.Layers = tp.VM, tp.Key, tp.Layers
	s := newSandbox(r, filepath.Join(r.StateDir(), "sandboxes", cid), m)
	fail := func(err error) (*sandbox, error) {
		_ = s.Destroy(context.WithoutCancel(ctx))
		if link != "" {
			_ = os.Remove(link)
		}
		return nil, fmt.Errorf("create sandbox %s from template: %w", spec.ID, err)
	}
	if err := os.MkdirAll(s.jail("disk"), 0o711); err != nil {
		return fail(err)
	}
	if err := writeMeta(s.Dir, m); err != nil {
		return fail(err)
	}
	layer := s.jail("disk", "layer.ext4")
	if err := host.CopySparse(tp.layer(), layer, 0o600); err != nil {
		return fail(err)
	}
	if err := os.Chown(layer, uid, uid); err != nil {
		return fail(err)
	}
	f, err := os.Open(tp.state())
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	s.OpMu.Lock()
	err = s.boot(ctx, &restoreFrom{state: f, hello: tp.Hello, linked: tp.Linked})
	s.OpMu.Unlock()
	if err != nil {
		return fail(err)
	}
	return s, nil
}

// park saves the running VM's memory to statePath and ends QEMU; it
// returns the Hello its agent is waiting to have answered. Callers hold
// OpMu.
func (s *sandbox) park(ctx context.Context, statePath string) (guest.Hello, error) {
	m := s.Meta()
	if !alive(m.PID, m.PIDStart) {
		return guest.Hello{}, runtime.ErrNotRunning
	}
	// End the session, then wait for the agent to notice and say hello
	// again: that proves it is back to waiting for a host. A disconnect
	// followed at once by a connect can reach the guest as no change at
	// all (the port's state is a flag, not a queue of events), leaving the
	// agent in its old session: then no hello comes, and the next
	// disconnect is one it cannot miss.
	s.Detach()
	var (
		conn net.Conn
		h    guest.Hello
		err  error
	)
	deadline := time.Now().Add(30 * time.Second)
	for wait := 2 * time.Second; ; wait = min(wait*2, 10*time.Second) {
		time.Sleep(50 * time.Millisecond)
		conn, err = host.DialUnix(ctx, s.jail(strings.TrimPrefix(jailAgent, "/")))
		if err == nil {
			h, err = guest.ReadHello(conn, wait)
			if err == nil {
				break
			}
			conn.Close()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return h, fmt.Errorf("park VM: agent did not say hello again: %w", err)
		}
	}
	defer conn.Close()
	mon, err := dialMonitor(ctx, s.jail(strings.TrimPrefix(jailQMP, "/")))
	if err != nil {
		return h, fmt.Errorf("park VM: %w", err)
	}
	defer mon.close()
	if err := mon.stop(ctx); err != nil {
		return h, fmt.Errorf("park VM: %w", err)
	}
	f, err := os.OpenFile(statePath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return h, err
	}
	defer f.Close()
	if err := mon.migrateToFile(ctx, f); err != nil {
		return h, fmt.Errorf("park VM: %w", err)
	}
	if err := f.Sync(); err != nil {
		return h, err
	}
	_ = mon.quit(ctx)
	if err := killWait(m.PID, m.PIDStart, 5*time.Second); err != nil {
		return h, err
	}
	return h, nil
}

var _ runtime.SaveSizer = (*Runtime)(nil)

// migrationSlack is what a saved VM adds to its RAM: the devices' state and
// the firmware's memory.
const migrationSlack = 16 << 20

// MaxSaveBytes implements runtime.SaveSizer. A VM's memory is saved with
// QMP migrate (a pause, a fork's park): every page of its RAM (vmLimits'
// guest size, the sandbox's memory and room for its kernel and agent)
// with a header of 8 bytes each, and the devices' state.
func (r *Runtime) MaxSaveBytes(l runtime.Limits) int64 {
	guestMiB, _, _ := vmLimits(l, false)
	ram := guestMiB << 20
	return ram + ram/512 + migrationSlack
}

// Pause saves a running sandbox's memory to disk and ends its VM: it then
// uses no CPU or memory, and Resume brings it back exactly where it was.
// A paused sandbox reports StatePaused; Exec fails with ErrNotRunning.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	s, err := r.get(id)
	if err != nil {
		return err
	}
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	h, err := s.park(ctx, s.Path("memory.state"))
	if err != nil {
		// A park that failed with QEMU still there leaves it running.
		return fmt.Errorf("pause sandbox %s: %w", id, s.unpark(ctx, err))
	}
	if err := s.leaveParked(h); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// leaveParked records a parked VM (QEMU ended, its memory saved with the
// agent's hello h) as paused: its jail's mounts and host cgroup go.
func (s *sandbox) leaveParked(h guest.Hello) error {
	if err := unmountAll(s.jail()); err != nil {
		return err
	}
	_ = host.RemoveCgroup(newHostCgroup(s.Meta().CgroupPath).Group)
	return s.SetMeta(func(m *meta) { m.Paused, m.Hello = true, h })
}

// Resume restores a paused sandbox from its saved memory.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	s, err := r.get(id)
	if err != nil {
		return err
	}
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	m := s.Meta()
	if !m.Paused {
		return fmt.Errorf("resume sandbox %s: not paused", id)
	}
	f, err := os.Open(s.Path("memory.state"))
	if err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	defer f.Close()
	if err := s.boot(ctx, &restoreFrom{state: f, hello: m.Hello, linked: m.Network != nil}); err != nil {
		_ = s.stopLocked(context.WithoutCancel(ctx))
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	_ = os.Remove(s.Path("memory.state"))
	return nil
}

// TemplateReady says whether the memory-snapshot template is built (for
// tests and the bench).
func (r *Runtime) TemplateReady() bool {
	t := r.tmpl
	return t != nil && t.ready() != nil
}
