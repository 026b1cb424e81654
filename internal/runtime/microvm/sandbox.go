package microvm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// sandbox is one VM. It implements runtime.Sandbox.
type sandbox struct {
	// Attachment is the state directory and meta, and the session of
	// the agent, which the host dials through QEMU's chardev (connectLoop).
	host.Attachment[meta]

	r *Runtime

	// logCancel (under Mu) ends the log drains (logs.go).
	logCancel context.CancelFunc
}

// newSandbox is the VM whose state directory is dir; nothing runs yet.
func newSandbox(r *Runtime, dir string, m meta) *sandbox {
	s := &sandbox{r: r}
	s.Init(s, dir, m, s.agent, r.Settings())
	return s
}

func (s *sandbox) jail(p ...string) string {
	return filepath.Join(append([]string{s.Dir, "jail"}, p...)...)
}

// Info implements runtime.Sandbox.
func (s *sandbox) Info() runtime.Info {
	return host.Info(Name, s.Meta().Accel, s.Agent.Hello())
}

// create makes the sandbox's disks and boots it; the caller destroys it on
// error.
func (s *sandbox) create(ctx context.Context, layers []runtime.Layer) error {
	m := s.Meta()
	if err := os.MkdirAll(s.jail("disk"), 0o711); err != nil {
		return err
	}
	if err := writeMeta(s.Dir, m); err != nil {
		return err
	}
	ids, err := layerDisk(ctx, s.jail("disk", "layer.ext4"), s.Path("staging"), m.Limits.DiskBytes, layers)
	if err != nil {
		return err
	}
	if err := os.Chown(s.jail("disk", "layer.ext4"), m.UID, m.UID); err != nil {
		return err
	}
	guestMiB, vcpus, _ := vmLimits(m.Limits, s.r.accel == "tcg")
	cfg := vmConfig{
		Accel: s.r.accel, MemMiB: guestMiB, VCPUs: vcpus, TSCKHz: s.r.tscKHz, Hostname: m.Hostname,
		// The agent counts as one of the sandbox's processes.
		Pids: max(m.Limits.Pids-1, 1), Memory: m.Limits.MemoryBytes,
		NIC: true, Volumes: m.Volumes,
	}
	if err := s.SetMeta(func(m *meta) { m.Layers, m.VM = ids, cfg }); err != nil {
		return err
	}
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	return s.boot(ctx, nil)
}

// boot starts QEMU for the sandbox's disks and waits for its agent. With
// incoming, the VM is restored from that memory snapshot instead of booted;
// the snapshot's agent is waiting for a Welcome to hello. Callers hold OpMu.
func (s *sandbox) boot(ctx context.Context, incoming *restoreFrom) error {
	m := s.Meta()
	base, err := s.r.baseDisk(ctx, m.BaseDir, m.BaseImage)
	if err != nil {
		return err
	}
	jail := s.jail()
	if err := unmountAll(jail); err != nil {
		return err
	}
	if err := makeJail(jail, m.UID, m.VM.Accel == "kvm"); err != nil {
		return fmt.Errorf("make jail: %w", err)
	}
	for src, dst := range map[string]string{s.r.kernel: jailKernel, s.r.initrd: jailInitrd, base: jailBase} {
		p := filepath.Join(jail, dst)
		_ = os.Remove(p)
		if err := linkReadOnly(src, p); err != nil {
			return err
		}
	}
	for _, f := range []string{jailQMP, jailAgent, jailConsole} {
		_ = os.Remove(filepath.Join(jail, f))
	}
	cg := newHostCgroup(m.CgroupPath)
	_, _, hostLimits := vmLimits(m.Limits, m.VM.Accel == "tcg")
	if err := cg.create(hostLimits); err != nil {
		return err
	}
	// QEMU's own messages go through a pipe into qemu.log, capped (see
	// logs.go); the write end is open before the drain starts.
	logw, err := s.LogPipe(qemuFIFO)
	if err != nil {
		return err
	}
	defer logw.Close()
	cfg := m.VM
	cfg.incoming = incoming != nil
	start := time.Now()
	var (
		nic   *tap
		extra []*os.File
	)
	if cfg.NIC && m.Network != nil {
		if nic, err = plugTap(m.Network); err != nil {
			return fmt.Errorf("plug the VM into its network: %w", err)
		}
		defer nic.file.Close() // QEMU has its own copy
		cfg.tapFD, cfg.mac = 3, nic.mac
		extra = append(extra, nic.file)
	}
	for _, v := range cfg.Volumes {
		// QEMU opens an image read-only before it reopens it to write:
		// a writer's fd set has both.
		flags := []int{os.O_RDONLY}
		if !v.ReadOnly {
			flags = append(flags, os.O_RDWR)
		}
		var fds []int
		for _, flag := range flags {
			f, err := os.OpenFile(v.Image, flag, 0)
			if err != nil {
				return fmt.Errorf("open the volume for %s: %w", v.Path, err)
			}
			defer f.Close() // QEMU has its own copy
			fds = append(fds, 3+len(extra))
			extra = append(extra, f)
		}
		cfg.volFDs = append(cfg.volFDs, fds)
	}
	proc, err := launch(s.r.qemu, jail, m.UID, cg, cfg, logw, extra...)
	if err != nil {
		return err
	}
	pstart, err := procStart(proc.Pid)
	if err != nil {
		_ = proc.Kill()
		_, _ = proc.Wait()
		return fmt.Errorf("qemu exited at once (see %s): %w", s.Path(qemuLog), err)
	}
	consoleUp := s.startLogs(proc.Pid, pstart)
	go func() { _, _ = proc.Wait() }() // reap it; exits are watched with a pidfd
	if err := s.SetMeta(func(m *meta) { m.PID, m.PIDStart, m.Stopped, m.Paused = proc.Pid, pstart, false, false }); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, s.r.StartTimeout())
	defer cancel()
	mon, err := dialMonitor(wctx, s.jail(strings.TrimPrefix(jailQMP, "/")))
	if err != nil {
		return s.bootErr(fmt.Errorf("connect to qemu: %w", err))
	}
	defer mon.close()
	// The VM is held (-S) until the console is read: nothing is lost.
	select {
	case <-consoleUp:
	case <-wctx.Done():
		return s.bootErr(fmt.Errorf("connect to the console: %w", wctx.Err()))
	}
	var agentConn net.Conn
	if incoming != nil {
		if agentConn, err = host.DialUnix(wctx, s.jail(strings.TrimPrefix(jailAgent, "/"))); err != nil {
			return s.bootErr(fmt.Errorf("connect to agent port: %w", err))
		}
		if err := mon.migrateFromFile(wctx, incoming.state); err != nil {
			agentConn.Close()
			return s.bootErr(err)
		}
	}
	if err := mon.cont(wctx); err != nil {
		if agentConn != nil {
			agentConn.Close()
		}
		return s.bootErr(err)
	}
	if incoming != nil {
		// The snapshot's agent already said hello and waits for the answer.
		c, err := guest.Resume(agentConn, incoming.hello, guest.ClientOptions{Home: s.ServeHome, Logger: s.r.log})
		if err != nil {
			return s.bootErr(err)
		}
		s.Agent.Set(c)
	}
	s.attach()
	c, err := s.agent(wctx)
	if err != nil {
		return s.bootErr(fmt.Errorf("wait for agent: %w", err))
	}
	if err := s.settle(wctx, c, m.Network, nic, incoming); err != nil {
		return s.bootErr(err)
	}
	s.r.log.Debug("sandbox VM up", "id", m.ID, "cid", m.CID, "accel", m.VM.Accel, "restored", incoming != nil, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// settle makes a booted VM's guest this sandbox's. After a restore from a
// memory snapshot its clock is set and its RNG reseeded: the clock stood
// still, and every clone of a template would share one RNG state. The link
// of a VM with a network is configured at every boot (a restored one had
// the template's link, down, or a fork parent's, with another sandbox's
// address and MAC); a restored guest without a network whose saved link
// was configured has it taken down.
func (s *sandbox) settle(ctx context.Context, c *guest.Client, n *runtime.Network, nic *tap, from *restoreFrom) error {
	if from != nil {
		entropy := make([]byte, 64)
		_, _ = rand.Read(entropy)
		if err := c.SetClock(ctx, time.Now(), entropy); err != nil {
			return fmt.Errorf("set clock after restore: %w", err)
		}
	}
	if !s.Meta().VM.NIC || (nic == nil && (from == nil || !from.linked)) {
		return nil
	}
	if err := c.ConfigureNetwork(ctx, netConfig(n, nic)); err != nil {
		return fmt.Errorf("configure the guest's network: %w", err)
	}
	return nil
}

// bootErr adds the console's last lines to a boot failure.
func (s *sandbox) bootErr(err error) error {
	if tail := consoleTail(s.Path(consoleLog), 15); tail != "" {
		return fmt.Errorf("%w\nguest console:\n%s", err, tail)
	}
	if b, rerr := os.ReadFile(s.Path(qemuLog)); rerr == nil && len(b) > 0 {
		return fmt.Errorf("%w\nqemu: %s", err, strings.TrimSpace(string(b)))
	}
	return err
}

// attach registers the sandbox with the runtime and, while its VM runs,
// keeps a connection to its agent.
func (s *sandbox) attach() {
	ctx := s.Begin(s.r.Context())
	m := s.Meta()
	c := s.Agent.Client()
	s.r.Table().Put(m.CID, s)
	if !m.Stopped && !m.Paused && c == nil {
		go s.connectLoop(ctx, m.PID, m.PIDStart)
	}
}

// connectLoop connects to the agent through QEMU's chardev socket and
// reconnects when the session ends, until the VM exits or ctx ends.
func (s *sandbox) connectLoop(ctx context.Context, pid int, start uint64) {
	exited := waitExit(ctx, pid, start)
	sock := s.jail(strings.TrimPrefix(jailAgent, "/"))
	for ctx.Err() == nil {
		select {
		case <-exited:
			return
		default:
		}
		if have := s.Agent.Client(); have != nil {
			select {
			case <-have.Done():
			case <-exited:
				return
			case <-ctx.Done():
				return
			}
			continue
		}
		conn, err := host.DialUnix(ctx, sock)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-exited:
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		// The agent says hello once it has booted: that may take long.
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		go func() {
			select {
			case <-exited:
				conn.Close()
			case <-ctx.Done():
			}
		}()
		c, err := guest.Accept(conn, guest.ClientOptions{Home: s.ServeHome, Logger: s.r.log, HandshakeTimeout: s.r.StartTimeout()})
		stop()
		if err != nil {
			if ctx.Err() == nil {
				s.r.log.Debug("agent handshake failed", "cid", s.Meta().CID, "err", err)
			}
			continue
		}
		s.Agent.Set(c)
	}
}

// Detach lets go of the VM without touching it (Runtime.Close, Stop):
// the log drains end too.
func (s *sandbox) Detach() {
	s.Mu.Lock()
	logCancel := s.logCancel
	s.logCancel = nil
	s.Mu.Unlock()
	s.Attachment.Detach()
	if logCancel != nil {
		logCancel()
	}
}

// agent returns the connected agent, waiting for it to (re)connect. It
// fails with ErrNotRunning once the VM is gone.
func (s *sandbox) agent(ctx context.Context) (*guest.Client, error) {
	return s.WaitAgent(ctx, 200*time.Millisecond, func(context.Context) bool {
		m := s.Meta()
		return !alive(m.PID, m.PIDStart)
	})
}

// State implements runtime.Sandbox. A paused sandbox (memory saved, QEMU
// gone) is StatePaused.
func (s *sandbox) State(ctx context.Context) (runtime.State, error) {
	m := s.Meta()
	switch {
	case m.Paused && !m.Stopped:
		return runtime.StatePaused, nil
	case m.Stopped || !alive(m.PID, m.PIDStart):
		return runtime.StateStopped, nil
	}
	return runtime.StateRunning, nil
}

// Quiesce implements runtime.Sandbox: the agent syncs and freezes every
// process of the sandbox (the guest's cgroup freezer); the agent itself
// keeps answering, so files can be read and Snapshot works meanwhile.
func (s *sandbox) Quiesce(ctx context.Context) (func(context.Context) error, error) {
	c, err := s.Call(ctx, "quiesce", func(c *guest.Client) error { return c.Freeze(ctx) })
	if err != nil {
		return nil, err
	}
	return host.Once(func(ctx context.Context) error {
		if err := c.Thaw(ctx); err != nil {
			return s.Failure(ctx, "resume", err)
		}
		return nil
	}), nil
}

// Snapshot implements runtime.Sandbox. The agent streams the layer (it
// freezes the sandbox's processes meanwhile); a stopped sandbox is booted
// for that, with nothing but its agent running, and stopped again.
func (s *sandbox) Snapshot(ctx context.Context, w io.Writer) (snapshot.Manifest, error) {
	m := s.Meta()
	if _, err := os.Stat(s.jail("disk", "layer.ext4")); err != nil {
		return snapshot.Manifest{}, fmt.Errorf("snapshot sandbox %s: %w", m.ID, runtime.ErrNotFound)
	}
	if st, _ := s.State(ctx); st != runtime.StateRunning {
		s.OpMu.Lock()
		err := s.boot(ctx, nil)
		s.OpMu.Unlock()
		if err != nil {
			_ = s.Stop(context.WithoutCancel(ctx))
			return snapshot.Manifest{}, fmt.Errorf("snapshot stopped sandbox %s: boot: %w", m.ID, err)
		}
		defer func() {
			if err := s.Stop(context.WithoutCancel(ctx)); err != nil {
				s.r.log.Error("stop after snapshot", "id", m.ID, "err", err)
			}
		}()
	}
	c, err := s.Call(ctx, "snapshot", nil)
	if err != nil {
		return snapshot.Manifest{}, err
	}
	var parent string
	if n := len(m.Layers); n > 0 {
		parent = m.Layers[n-1]
	}
	rc, err := c.ExportLayer(ctx, parent, m.BaseImage)
	if err != nil {
		return snapshot.Manifest{}, s.Failure(ctx, "snapshot", err)
	}
	defer rc.Close()
	h := sha256.New()
	head := &prefix{max: 1 << 20}
	// The stream is the guest's to shape: it may not be longer than a
	// layer of the sandbox's disk can be, whatever the guest sends.
	limit := layerStreamLimit(m.Limits.DiskBytes)
	n, err := io.Copy(io.MultiWriter(w, h, head), &boundedReader{r: rc, left: limit})
	if errors.Is(err, errStreamTooLong) {
		return snapshot.Manifest{}, fmt.Errorf("snapshot sandbox %s: %w", m.ID, errdefs.Wrap(nil, snapshot.ErrTooLarge,
			fmt.Sprintf("the filesystem snapshot from the sandbox is longer than %d MiB, more than its %d MiB disk can hold", limit>>20, m.Limits.DiskBytes>>20)))
	}
	if err != nil {
		return snapshot.Manifest{}, s.Failure(ctx, "snapshot", err)
	}
	// The blob comes from the guest: its manifest must say what the host
	// asked for, or it could claim another layer as its parent.
	man, err := snapshot.ReadManifest(bytes.NewReader(head.b))
	if err != nil {
		return snapshot.Manifest{}, fmt.Errorf("snapshot sandbox %s: layer from the guest: %w", m.ID, err)
	}
	if man.Parent != parent || man.BaseImage != m.BaseImage || man.Version != snapshot.FormatVersion {
		return snapshot.Manifest{}, fmt.Errorf("snapshot sandbox %s: the guest's layer claims parent %q base %q version %d", m.ID, man.Parent, man.BaseImage, man.Version)
	}
	man.ID = "sha256:" + hex.EncodeToString(h.Sum(nil))
	man.Size = n
	return man, nil
}

// layerStreamLimit is the longest compressed layer a disk of diskBytes can
// produce: its data, plus the tar headers of as many inodes as mkfs gives
// it (one per 16 KiB, up to 1.5 KiB of headers each), plus slack for zstd
// frames of incompressible data.
func layerStreamLimit(diskBytes int64) int64 {
	return diskBytes + diskBytes/8 + 16<<20
}

var errStreamTooLong = errors.New("layer stream longer than its limit")

// boundedReader reads at most left bytes of r and fails, instead of
// returning EOF, when r has more.
type boundedReader struct {
	r    io.Reader
	left int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a stream that ends exactly here from one
		// that goes on.
		var one [1]byte
		if n, err := b.r.Read(one[:]); n > 0 {
			return 0, errStreamTooLong
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

// prefix keeps the first max bytes written to it.
type prefix struct {
	b   []byte
	max int
}

func (p *prefix) Write(b []byte) (int, error) {
	if room := p.max - len(p.b); room > 0 {
		p.b = append(p.b, b[:min(room, len(b))]...)
	}
	return len(b), nil
}

// HostDiskBytes implements runtime.Sandbox.
func (s *sandbox) HostDiskBytes() int64 { return allocated(s.jail("disk", "layer.ext4")) }

// Stats implements runtime.Sandbox. MemoryBytes is what the guest charges
// to the sandbox's processes (the quantity Limits.MemoryBytes bounds); CPU
// and Pids are QEMU's on the host.
func (s *sandbox) Stats(ctx context.Context) (runtime.Stats, error) {
	m := s.Meta()
	out := runtime.Stats{DiskBytes: allocated(s.jail("disk", "layer.ext4"))}
	if st, _ := s.State(ctx); st != runtime.StateRunning {
		return out, nil
	}
	cs, err := newHostCgroup(m.CgroupPath).Stats()
	if err != nil {
		return out, fmt.Errorf("stats of sandbox %s: %w", m.ID, err)
	}
	out.CPU, out.Pids, out.MemoryBytes = cs.CPU, cs.Pids, cs.MemoryBytes
	c := s.Agent.Client()
	if c == nil {
		return out, nil
	}
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if h, err := c.Ping(actx); err == nil {
		out.Processes = h.Processes
	}
	if rc, err := c.ReadFile(actx, "/sys/fs/cgroup/sandbox/memory.current"); err == nil {
		b, rerr := io.ReadAll(io.LimitReader(rc, 64))
		rc.Close()
		if v, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); rerr == nil && perr == nil {
			out.MemoryBytes = v
		}
	}
	return out, nil
}

// Stop implements runtime.Sandbox: the agent flushes the guest's writes,
// QEMU quits (killed if it does not), the jail's mounts and the host cgroup
// go; the disks stay.
func (s *sandbox) Stop(ctx context.Context) error {
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	return s.stopLocked(ctx)
}

func (s *sandbox) stopLocked(ctx context.Context) error {
	m := s.Meta()
	var errs []error
	if alive(m.PID, m.PIDStart) {
		if c := s.Agent.Client(); c != nil {
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = c.Sync(sctx)
			cancel()
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if mon, err := dialMonitor(qctx, s.jail(strings.TrimPrefix(jailQMP, "/"))); err == nil {
			_ = mon.quit(qctx)
			mon.close()
		}
		cancel()
		deadline := time.Now().Add(3 * time.Second)
		for alive(m.PID, m.PIDStart) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if err := killWait(m.PID, m.PIDStart, 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	s.Detach()
	if err := unmountAll(s.jail()); err != nil {
		errs = append(errs, err)
	}
	// A QEMU whose pid never reached the meta (sandboxd ended right after
	// launching it) is still in the group: nothing of a stopped sandbox
	// runs on.
	errs = append(errs, host.EndCgroup(m.CgroupPath)...)
	return s.Stopped(func(m *meta) { m.Stopped = true }, errs)
}

// Destroy implements runtime.Sandbox; its uid is free again once its
// state directory is gone.
func (s *sandbox) Destroy(ctx context.Context) error {
	err := host.Destroy(ctx, s.r.Base, s, &s.Attachment, s.stopLocked,
		func(meta) error { return unmountAll(s.Dir) })
	m := s.Meta()
	s.r.releaseUID(m.UID, m.CID)
	return err
}

// restoreFrom is a memory snapshot to start a VM from.
type restoreFrom struct {
	state *os.File    // the migration stream, passed to QEMU through QMP
	hello guest.Hello // what the agent said before it was saved
	// linked: the saved guest's link was configured (it had a network).
	linked bool
}
