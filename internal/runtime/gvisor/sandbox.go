package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"golang.org/x/time/rate"

	"github.com/sandboxd/sandboxd/internal/cgroup"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// agentFIFO is the pipe the container's output comes through (see create).
const agentFIFO = "agent.fifo"

// sandbox is one runsc container and everything around it on the host.
type sandbox struct {
	// Attachment is the state directory and meta, and the session of
	// the agent, which dials in on sock/agent.sock (acceptLoop).
	host.Attachment[meta]

	r *Runtime

	// guardCtx (under Mu) is the context the memory guard runs under.
	guardCtx context.Context
	// listening (under Mu) is the agent socket of the current attachment
	// and session the agent's connection on it (see disconnect).
	listening *listening
	session   *peerConn
}

func (s *sandbox) upperDir() string { return s.Path("layer", "upper") }

// newSandbox is the container in dir that m describes, not attached yet.
// (host.Base[*sandbox] makes sure *sandbox is a runtime.Sandbox.)
func newSandbox(r *Runtime, dir string, m meta) *sandbox {
	s := &sandbox{r: r}
	s.Init(s, dir, m, s.agent, r.Settings())
	return s
}

// Info implements runtime.Sandbox.
func (s *sandbox) Info() runtime.Info {
	return host.Info(Name, s.Meta().Platform, s.Agent.Hello())
}

// create builds the sandbox on the host and starts it; the caller destroys
// it on error.
func (s *sandbox) create(ctx context.Context, layers []runtime.Layer) error {
	m := s.Meta()
	if err := s.makeDirs(); err != nil {
		return err
	}
	if m.Limits.DiskBytes > 0 {
		if err := makeDisk(ctx, s.Path("disk.img"), s.Path("layer"), m.Limits.DiskBytes); err != nil {
			return err
		}
		m.Disk = true
	}
	if err := os.Mkdir(s.upperDir(), 0o755); err != nil {
		return err
	}
	if err := s.mountVolumes(ctx, m.Volumes); err != nil {
		return err
	}
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return fmt.Errorf("make agent secret: %w", err)
	}
	m.AgentSecret = hex.EncodeToString(secret[:])
	if err := os.Mkdir(s.Path("layer", "work"), 0o700); err != nil {
		return err
	}
	// The restored layers share the sandbox's disk: one budget for all,
	// so a layer that expands past the disk limit is refused with a clear
	// error before it fills the disk.
	budget := snapshot.NewBudget(m.Limits.DiskBytes)
	for i, l := range layers {
		dir := s.lowerDir(i)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		id, err := snapshot.ApplyVerified(ctx, l.R, l.ID, dir, budget)
		if err != nil {
			return fmt.Errorf("restore layer %d: %w", i, err)
		}
		m.Layers = append(m.Layers, id)
	}
	s.Mu.Lock()
	s.M = m
	s.Mu.Unlock()
	return s.start(ctx, "run", "--bundle", s.Path("bundle"), "--detach", m.CID)
}

// makeDirs makes the sandbox's state directory and those in it.
func (s *sandbox) makeDirs() error {
	for _, d := range []string{s.Dir, s.Path("layer"), s.Path("rootfs"), s.Path("sock"), s.Path("bundle")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	return nil
}

// lowerDir is where restored layer i lives, in the writable layer's disk.
func (s *sandbox) lowerDir(i int) string { return s.Path("layer", fmt.Sprintf("lower-%d", i)) }

// start mounts the root filesystem over the writable layer made in layer/
// (its restored lowers, upper and work directories), writes the bundle and
// the meta, and starts the container with the runsc subcommand args (run,
// or restore from a saved state), waiting for its agent.
func (s *sandbox) start(ctx context.Context, args ...string) error {
	m := s.Meta()
	lowers := make([]string, len(m.Layers))
	for i := range lowers {
		lowers[i] = s.lowerDir(i)
	}
	if err := mountOverlay(s.Path("rootfs"), m.BaseDir, lowers, s.upperDir(), s.Path("layer", "work")); err != nil {
		return err
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost sandboxd.internal\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", m.Hostname)
	if err := os.WriteFile(s.Path("hosts"), []byte(hosts), 0o644); err != nil {
		return err
	}
	spec := buildSpec(&m, s.Path("rootfs"), filepath.Join(s.r.StateDir(), "bin"), s.Path("sock"), s.Path("hosts"), s.r.preload, s.r.pidsCeiling)
	for i, v := range m.Volumes {
		opts := []string{"rbind", "rw", "nosuid", "nodev"}
		if v.ReadOnly {
			opts[1] = "ro"
		}
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: v.Path, Type: "bind", Source: s.volumeDir(i), Options: opts})
	}
	network, err := withNetwork(spec, m.Network, s.Path("resolv.conf"))
	if err != nil {
		return err
	}
	if err := writeSpec(s.Path("bundle"), spec); err != nil {
		return err
	}
	if err := writeMeta(s.Dir, m); err != nil {
		return err
	}
	// runsc's output and the container's stdout and stderr (PID 1's,
	// which any process inside can write to) go through a pipe that
	// sandboxd drains into agent.log, capped (see caplog): the open write
	// end must exist before attach starts draining.
	logw, err := s.LogPipe(agentFIFO)
	if err != nil {
		return err
	}
	defer logw.Close()
	if err := s.attach(); err != nil {
		return err
	}
	cmd := s.r.runscFor(ctx, m, network, args...)
	// The log pipe itself, an *os.File: the detached sandbox process
	// inherits it and keeps writing, and anything else (a Go writer, so a
	// pipe Run waits on) would hold Run until the sandbox ends.
	cmd.Stdout, cmd.Stderr = logw, logw
	before := logSize(s.Path("agent.log"))
	if err := cmd.Run(); err != nil {
		return runscFailed(args[0], err, s.Path("agent.log"), before)
	}
	s.startGuard()
	wctx, cancel := context.WithTimeout(ctx, s.r.StartTimeout())
	defer cancel()
	c, err := s.agent(wctx)
	if err != nil {
		return fmt.Errorf("wait for agent: %w", err)
	}
	// One request now opens the session's HTTP/2 connection (a yamux
	// stream, the preface and settings): a sandbox started ahead is
	// handed out with it, and its first request, the workspace's, does
	// not pay for it (8-14 ms under gVisor). A failure is the next
	// request's to report.
	_, _ = c.Ping(wctx)
	return nil
}

// attach listens for the agent, registers the sandbox with the runtime and
// starts the memory guard.
func (s *sandbox) attach() error {
	sock := s.Path("sock", "agent.sock")
	_ = os.Remove(sock) // a previous process's socket
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen for agent: %w", err)
	}
	// The listener is closed by a goroutine (below) that may run after
	// another attach of the same sandbox (a runtime made again on the same
	// state, as a restart within one process does) has listened on the same
	// path: unlinking on close would remove the new listener's socket, and
	// the agent, redialling the path, would never reach it. The path is
	// removed before each listen instead.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ctx := s.Begin(s.r.Context())
	// Detach ends ctx: the accept loop, the log drain and the memory
	// guard end with it.
	context.AfterFunc(ctx, func() { ln.Close() })
	l := &listening{ln: ln}
	s.Mu.Lock()
	s.guardCtx = ctx
	s.listening, s.session = l, nil
	m := s.M
	s.Mu.Unlock()
	s.r.Table().Put(m.CID, s)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		s.acceptLoop(l)
	}()
	go s.DrainLog(ctx, agentFIFO, "agent.log")
	return nil
}

// startGuard starts the memory guard once the container (and so its
// cgroup) exists.
func (s *sandbox) startGuard() {
	s.Mu.Lock()
	ctx, m := s.guardCtx, s.M
	s.Mu.Unlock()
	if ctx != nil && m.Limits.MemoryBytes > 0 && !m.Halted() {
		go s.guardMemory(ctx)
	}
}

// maxHandshakes bounds the agent handshakes in progress at once: any
// process in the sandbox can connect to the agent socket, and one that never
// finishes its handshake must not hold up the real agent's, nor make the
// host start goroutines without end.
const maxHandshakes = 4

// listening is an attachment's agent socket: wg counts its accept loop
// and the handshakes under way; closed (under the sandbox's Mu) says the
// attachment let go of it (Detach).
type listening struct {
	ln     net.Listener
	wg     sync.WaitGroup
	closed bool
}

// Detach lets go of the sandbox (host.Attachment's), closing its agent
// socket first. The agent redials the moment its session closes: had the
// socket still been open (its close was the attachment context's, in a
// goroutine of its own), the agent could connect to this attachment
// again and stay with a runtime that let go, never reaching the one made
// next on the same state (a runtime made again within one process, as
// the Reattach tests do). A handshake that ends after this is refused
// (acceptLoop).
func (s *sandbox) Detach() {
	s.Mu.Lock()
	if l := s.listening; l != nil && !l.closed {
		l.closed = true
		l.ln.Close()
	}
	s.Mu.Unlock()
	s.Attachment.Detach()
}

// acceptLoop serves the agent socket. Only a peer that proves it holds the
// sandbox's secret (the real agent, see meta.AgentSecret) gets a session;
// it replaces the previous one (the agent reconnected).
func (s *sandbox) acceptLoop(l *listening) {
	slots := make(chan struct{}, maxHandshakes)
	refusals := rate.Sometimes{First: 3, Interval: 10 * time.Second}
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			conn.Close()
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-slots }()
			m := s.Meta()
			secret, _ := hex.DecodeString(m.AgentSecret)
			pc := newPeerConn(conn)
			c, err := guest.Accept(pc, guest.ClientOptions{Home: s.ServeHome, Secret: secret, Logger: s.r.log})
			if err != nil {
				refusals.Do(func() {
					s.r.log.Warn("agent handshake refused", "id", m.ID, "cid", m.CID, "err", err)
				})
				return
			}
			// Under Mu with Detach: either this session is set before
			// Detach closes the current one, or it is refused here.
			s.Mu.Lock()
			defer s.Mu.Unlock()
			if l.closed {
				c.Close()
				return
			}
			s.Agent.Set(c)
			s.session = pc
		}()
	}
}

// agent returns the connected agent, waiting for it to (re)connect. It
// fails with ErrNotRunning once the container is gone.
func (s *sandbox) agent(ctx context.Context) (*guest.Client, error) {
	return s.WaitAgent(ctx, time.Second, func(ctx context.Context) bool {
		st, err := s.State(ctx)
		return err == nil && st != runtime.StateRunning
	})
}

// State implements runtime.Sandbox.
func (s *sandbox) State(ctx context.Context) (runtime.State, error) {
	m := s.Meta()
	switch {
	case m.Stopped:
		return runtime.StateStopped, nil
	case m.Paused:
		// runsc would say stopped: the container ended once saved.
		return runtime.StatePaused, nil
	}
	status, err := s.runscStatus(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if errors.Is(err, errNoContainer) {
			return runtime.StateStopped, nil
		}
		return "", err
	}
	switch status {
	case "running", "paused", "created":
		return runtime.StateRunning, nil
	}
	return runtime.StateStopped, nil
}

// Quiesce implements runtime.Sandbox: the agent syncs (gVisor flushes its
// page cache to the host files) and runsc pauses every task.
func (s *sandbox) Quiesce(ctx context.Context) (func(context.Context) error, error) {
	if _, err := s.Call(ctx, "quiesce", func(c *guest.Client) error { return c.Sync(ctx) }); err != nil {
		return nil, err
	}
	m := s.Meta()
	cid := m.CID
	if _, err := s.r.runscRun(ctx, m, "pause", cid); err != nil {
		return nil, fmt.Errorf("quiesce sandbox %s: %w", s.ID(), err)
	}
	return host.Once(func(ctx context.Context) error {
		if _, err := s.r.runscRun(ctx, m, "resume", cid); err != nil {
			return fmt.Errorf("resume sandbox %s: %w", s.ID(), err)
		}
		return nil
	}), nil
}

// errNoContainer: runsc has no record of the container (it ended).
var errNoContainer = errors.New("runsc knows no such container")

// runscStatus is the container's status as runsc reports it ("running",
// "paused", "created", "stopped").
func (s *sandbox) runscStatus(ctx context.Context) (string, error) {
	m := s.Meta()
	out, err := s.r.runscRun(ctx, m, "state", m.CID)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errNoContainer, err)
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("parse runsc state: %w", err)
	}
	return st.Status, nil
}

// thaw resumes a container that an earlier process left paused by runsc
// (it stopped between the pause and the resume of a Quiesce or a fork):
// sandboxd keeps a container frozen only while it copies it, so one found
// frozen would never run again otherwise.
func (s *sandbox) thaw(ctx context.Context) {
	if status, err := s.runscStatus(ctx); err != nil || status != "paused" {
		return
	}
	m := s.Meta()
	if _, err := s.r.runscRun(ctx, m, "resume", m.CID); err != nil {
		s.r.log.Warn("resume a sandbox left frozen", "id", m.ID, "err", err)
		return
	}
	s.r.log.Info("resumed a sandbox left frozen by an earlier process", "id", m.ID)
}

// Snapshot implements runtime.Sandbox.
func (s *sandbox) Snapshot(ctx context.Context, w io.Writer) (snapshot.Manifest, error) {
	if st, err := s.State(ctx); err == nil && st == runtime.StateRunning {
		resume, err := s.Quiesce(ctx)
		if err != nil {
			return snapshot.Manifest{}, err
		}
		defer func() {
			if err := resume(context.WithoutCancel(ctx)); err != nil {
				s.r.log.Error("resume after snapshot", "id", s.ID(), "err", err)
			}
		}()
	}
	m := s.Meta()
	if _, err := os.Stat(s.upperDir()); err != nil {
		return snapshot.Manifest{}, fmt.Errorf("snapshot sandbox %s: %w", m.ID, runtime.ErrNotFound)
	}
	man := snapshot.Manifest{BaseImage: m.BaseImage}
	if n := len(m.Layers); n > 0 {
		man.Parent = m.Layers[n-1]
	}
	man, err := snapshot.Write(ctx, w, s.upperDir(), man, snapshot.NewBudget(m.Limits.DiskBytes))
	if err != nil {
		return man, fmt.Errorf("snapshot sandbox %s: %w", m.ID, err)
	}
	return man, nil
}

// HostDiskBytes implements runtime.Sandbox.
func (s *sandbox) HostDiskBytes() int64 {
	if s.Meta().Disk {
		return allocatedBytes(s.Path("disk.img"))
	}
	return dirSize(s.Path("layer"))
}

// Stats implements runtime.Sandbox.
func (s *sandbox) Stats(ctx context.Context) (runtime.Stats, error) {
	m := s.Meta()
	var out runtime.Stats
	if m.Disk {
		out.DiskBytes = diskUsage(s.Path("layer"))
	} else {
		out.DiskBytes = dirSize(s.Path("layer"))
	}
	if m.Halted() {
		return out, nil // no cgroup, nothing running
	}
	cs, err := cgroup.New(m.CgroupPath).Stats()
	if err != nil {
		return out, fmt.Errorf("stats of sandbox %s: %w", m.ID, err)
	}
	out.MemoryBytes, out.CPU, out.Pids = cs.MemoryBytes, cs.CPU, cs.Pids
	if c := s.Agent.Client(); c != nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if h, err := c.Ping(pctx); err == nil {
			out.Processes = h.Processes
		}
	}
	return out, nil
}

// guardMemory is the sandbox's OOM killer (see the package doc).
func (s *sandbox) guardMemory(ctx context.Context) {
	m := s.Meta()
	g := cgroup.New(m.CgroupPath)
	// runsc has made the cgroup by now; its controllers appear one by one,
	// so wait for the memory controller's files themselves.
	for i := 0; ; i++ {
		if _, err := g.MemoryLimit(); err == nil {
			break
		}
		if i == 300 {
			s.r.log.Warn("memory guard not running: no memory cgroup", "id", m.ID, "cgroup", m.CgroupPath)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	err := g.WatchMemory(ctx, m.Limits.MemoryBytes, func() {
		c := s.Agent.Client()
		if c == nil {
			return
		}
		for range 8 {
			kctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			k, err := c.OOMKill(kctx)
			cancel()
			if err != nil || k.PID == 0 {
				return
			}
			s.r.log.Warn("sandbox out of memory: killed a process", "id", s.ID(), "pid", k.PID, "name", k.Name, "rss", k.RSS)
			// gVisor returns freed memory to the host asynchronously.
			for range 10 {
				time.Sleep(20 * time.Millisecond)
				if st, err := g.Stats(); err != nil || st.MemoryBytes < m.Limits.MemoryBytes {
					return
				}
			}
		}
	})
	if err != nil && ctx.Err() == nil {
		s.r.log.Warn("memory guard not running", "id", m.ID, "err", err)
	}
}

// Stop implements runtime.Sandbox.
func (s *sandbox) Stop(ctx context.Context) error {
	s.Detach()
	m := s.Meta()
	var errs []error
	if _, err := s.r.runscRun(ctx, m, "delete", "--force", m.CID); err != nil && !strings.Contains(err.Error(), "does not exist") &&
		!strings.Contains(err.Error(), "not found") {
		errs = append(errs, err)
	}
	if err := unmount(s.Path("rootfs")); err != nil {
		errs = append(errs, err)
	}
	// A paused sandbox that stops will not resume: its saved memory goes.
	if err := s.dropCheckpoint(); err != nil {
		errs = append(errs, err)
	}
	return s.Stopped(func(m *meta) { m.Stopped, m.Paused = true, false }, errs)
}

// Destroy implements runtime.Sandbox.
func (s *sandbox) Destroy(ctx context.Context) error {
	return host.Destroy(ctx, s.r.Base, s, &s.Attachment, s.Stop,
		func(m meta) error { return errors.Join(s.unmountVolumes(m.Volumes), unmount(s.Path("layer"))) },
		// runsc delete ends what runsc knows of; a create cut short
		// before runsc recorded its container leaves its sandbox and
		// gofer processes running, in this group. Nothing of a destroyed
		// sandbox runs on.
		func(m meta) error { return errors.Join(host.EndCgroup(m.CgroupPath)...) })
}

// runscFailed is the error of a runsc command that failed, with the last
// lines it wrote to the log at logPath past offset from (its size before
// the command): that log is on this host only, and the error reaches the
// API's logs and the caller. The log is filled from a pipe as it drains,
// so the lines are waited for briefly.
func runscFailed(what string, err error, logPath string, from int64) error {
	var said string
	for range 10 {
		if said = logTail(logPath, from, 3); said != "" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if said != "" {
		return fmt.Errorf("runsc %s: %w: %s (more in %s)", what, err, said, logPath)
	}
	return fmt.Errorf("runsc %s: %w (see %s)", what, err, logPath)
}

// logSize is the size of the log at path, 0 when it cannot be read.
func logSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logTail is the last n lines written to the log at path past offset
// from, joined with " | "; at most its last 64 KiB are read.
func logTail(path string, from int64, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	if fi, err := f.Stat(); err == nil {
		from = max(from, fi.Size()-window)
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(f, window))
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.TrimSpace(strings.Join(lines, " | "))
}
