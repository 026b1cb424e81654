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

	"golang.org/x/time/rate"

	"github.com/sandboxd/sandboxd/internal/caplog"
	"github.com/sandboxd/sandboxd/internal/cgroup"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// sandbox is one runsc container and everything around it on the host.
type sandbox struct {
	// Ops serves Exec, ReadFile, WriteFile and ListDir through the agent.
	host.Ops

	r   *Runtime
	dir string

	// agentSlot is the session with the guest agent, which reconnects.
	agentSlot host.Slot

	mu     sync.Mutex
	m      meta
	ln     net.Listener
	gate   *homegate.Gate     // serves sandboxd.internal while attached
	cancel context.CancelFunc // ends the accept loop and the memory guard
	// guardCtx is the context the memory guard runs under.
	guardCtx context.Context
	gone     bool // destroyed
}

var _ runtime.Sandbox = (*sandbox)(nil)

func newSandbox(r *Runtime, dir string, m meta) *sandbox {
	s := &sandbox{r: r, dir: dir, m: m}
	s.Ops = host.Ops{Conn: s.ops}
	return s
}

func (s *sandbox) path(p ...string) string { return filepath.Join(append([]string{s.dir}, p...)...) }

func (s *sandbox) upperDir() string { return s.path("layer", "upper") }

func (s *sandbox) meta() meta {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m
}

// ID implements runtime.Sandbox.
func (s *sandbox) ID() string { return s.meta().ID }

// Info implements runtime.Sandbox.
func (s *sandbox) Info() runtime.Info {
	return host.Info(Name, s.meta().Platform, s.agentSlot.Hello())
}

// create builds the sandbox on the host and starts it; the caller destroys
// it on error.
func (s *sandbox) create(ctx context.Context, layers []runtime.Layer) error {
	m := s.meta()
	for _, d := range []string{s.dir, s.path("layer"), s.path("rootfs"), s.path("sock"), s.path("bundle")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if m.Limits.DiskBytes > 0 {
		if err := makeDisk(ctx, s.path("disk.img"), s.path("layer"), m.Limits.DiskBytes); err != nil {
			return err
		}
		m.Disk = true
	}
	if err := os.Mkdir(s.upperDir(), 0o755); err != nil {
		return err
	}
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return fmt.Errorf("make agent secret: %w", err)
	}
	m.AgentSecret = hex.EncodeToString(secret[:])
	if err := os.Mkdir(s.path("layer", "work"), 0o700); err != nil {
		return err
	}
	var lowers []string
	// The restored layers share the sandbox's disk: one budget for all,
	// so a layer that expands past the disk limit is refused with a clear
	// error before it fills the disk.
	budget := snapshot.NewBudget(m.Limits.DiskBytes)
	for i, l := range layers {
		dir := s.path("layer", fmt.Sprintf("lower-%d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return err
		}
		id, err := snapshot.ApplyVerified(ctx, l.R, l.ID, dir, budget)
		if err != nil {
			return fmt.Errorf("restore layer %d: %w", i, err)
		}
		m.Layers = append(m.Layers, id)
		lowers = append(lowers, dir)
	}
	if err := mountOverlay(s.path("rootfs"), m.BaseDir, lowers, s.upperDir(), s.path("layer", "work")); err != nil {
		return err
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost sandboxd.internal\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", m.Hostname)
	if err := os.WriteFile(s.path("hosts"), []byte(hosts), 0o644); err != nil {
		return err
	}
	spec := buildSpec(&m, s.path("rootfs"), filepath.Join(s.r.opts.StateDir, "bin"), s.path("sock"), s.path("hosts"), s.r.preload, s.r.pidsCeiling)
	network, err := withNetwork(spec, m.Network, s.path("resolv.conf"))
	if err != nil {
		return err
	}
	if err := writeSpec(s.path("bundle"), spec); err != nil {
		return err
	}
	s.mu.Lock()
	s.m = m
	s.mu.Unlock()
	if err := writeMeta(s.dir, m); err != nil {
		return err
	}
	// runsc's output and the container's stdout and stderr (PID 1's,
	// which any process inside can write to) go through a pipe that
	// sandboxd drains into agent.log, capped (see caplog): the open write
	// end must exist before attach starts draining.
	if err := caplog.MakeFIFO(s.path(agentFIFO)); err != nil {
		return err
	}
	logw, err := caplog.WriteEnd(s.path(agentFIFO))
	if err != nil {
		return err
	}
	defer logw.Close()
	if err := s.attach(); err != nil {
		return err
	}
	cmd := s.r.runscNetCmd(ctx, network, "run", "--bundle", s.path("bundle"), "--detach", m.CID)
	cmd.Stdout, cmd.Stderr = logw, logw
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc run: %w (see %s)", err, s.path("agent.log"))
	}
	s.startGuard()
	wctx, cancel := context.WithTimeout(ctx, s.r.opts.StartTimeout)
	defer cancel()
	if _, err := s.agent(wctx); err != nil {
		return fmt.Errorf("wait for agent: %w", err)
	}
	return nil
}

// attach listens for the agent, registers the sandbox with the runtime and
// starts the memory guard.
func (s *sandbox) attach() error {
	sock := s.path("sock", "agent.sock")
	_ = os.Remove(sock) // a previous process's socket
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("listen for agent: %w", err)
	}
	ctx, cancel := context.WithCancel(s.r.ctx)
	gate := homegate.New(homegate.Options{
		Dial: s.dialHome, Sandbox: s.ID, Limits: s.r.opts.Home, Metrics: s.r.opts.HomeMetrics, Logger: s.r.log,
	})
	s.mu.Lock()
	s.ln, s.cancel, s.gate = ln, cancel, gate
	m := s.m
	s.mu.Unlock()
	s.r.table.Put(m.CID, s)
	go s.acceptLoop(ln, gate)
	go s.drainLog(ctx)
	s.mu.Lock()
	s.guardCtx = ctx
	s.mu.Unlock()
	return nil
}

// agentFIFO is the pipe the container's output comes through (see create).
const agentFIFO = "agent.fifo"

// drainLog copies the container's output into agent.log, capped, until the
// container has exited (every writer closed the pipe) or ctx ends. A later
// sandboxd continues the same file.
func (s *sandbox) drainLog(ctx context.Context) {
	fifo := s.path(agentFIFO)
	if _, err := os.Lstat(fifo); err != nil {
		return // made by an older sandboxd, with a plain agent.log
	}
	w, err := caplog.Open(s.path("agent.log"), s.r.opts.LogMaxBytes)
	if err != nil {
		s.r.log.Warn("agent log not kept", "cid", s.meta().CID, "err", err)
		return
	}
	defer w.Close()
	if err := caplog.Drain(ctx, fifo, w); err != nil && ctx.Err() == nil {
		s.r.log.Warn("draining agent log", "cid", s.meta().CID, "err", err)
	}
	if d := w.Dropped(); d > 0 {
		s.r.log.Info("agent log capped", "cid", s.meta().CID, "dropped_bytes", d)
	}
}

// startGuard starts the memory guard once the container (and so its
// cgroup) exists.
func (s *sandbox) startGuard() {
	s.mu.Lock()
	ctx, m := s.guardCtx, s.m
	s.mu.Unlock()
	if ctx != nil && m.Limits.MemoryBytes > 0 && !m.Stopped {
		go s.guardMemory(ctx)
	}
}

// detach lets go of the sandbox without touching it (Runtime.Close).
func (s *sandbox) detach() {
	s.mu.Lock()
	ln, cancel, gate := s.ln, s.cancel, s.gate
	s.ln, s.cancel, s.gate = nil, nil, nil
	s.mu.Unlock()
	c := s.agentSlot.Client()
	if cancel != nil {
		cancel()
	}
	if ln != nil {
		ln.Close()
	}
	if c != nil {
		c.Close()
	}
	if gate != nil {
		gate.Close()
	}
}

// maxHandshakes bounds the agent handshakes in progress at once: any
// process in the sandbox can connect to the agent socket, and one that never
// finishes its handshake must not hold up the real agent's, nor make the
// host start goroutines without end.
const maxHandshakes = 4

// acceptLoop serves the agent socket. Only a peer that proves it holds the
// sandbox's secret (the real agent, see meta.AgentSecret) gets a session;
// it replaces the previous one (the agent reconnected).
func (s *sandbox) acceptLoop(ln net.Listener, gate *homegate.Gate) {
	slots := make(chan struct{}, maxHandshakes)
	refusals := rate.Sometimes{First: 3, Interval: 10 * time.Second}
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			conn.Close()
			continue
		}
		go func() {
			defer func() { <-slots }()
			m := s.meta()
			secret, _ := hex.DecodeString(m.AgentSecret)
			c, err := guest.Accept(conn, guest.ClientOptions{Home: gate.Serve, Secret: secret, Logger: s.r.log})
			if err != nil {
				refusals.Do(func() {
					s.r.log.Warn("agent handshake refused", "id", m.ID, "cid", m.CID, "err", err)
				})
				return
			}
			s.agentSlot.Set(c)
		}()
	}
}

// dialHome connects a sandbox's sandboxd.internal connection to the API.
func (s *sandbox) dialHome(ctx context.Context) (net.Conn, error) {
	sock := s.meta().HomeSocket
	if sock == "" {
		return nil, errors.New("sandbox has no home socket")
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", sock)
}

// agent returns the connected agent, waiting for it to (re)connect. It
// fails with ErrNotRunning once the container is gone.
func (s *sandbox) agent(ctx context.Context) (*guest.Client, error) {
	return s.agentSlot.Wait(ctx, time.Second, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.m.Stopped || s.gone
	}, func(ctx context.Context) bool {
		st, err := s.State(ctx)
		return err == nil && st != runtime.StateRunning
	})
}

// ops serves the operations every backend does through the agent.
func (s *sandbox) ops() host.Conn {
	return host.Conn{Sandbox: s, Env: s.meta().Env, Agent: s.agent}
}

// failure explains an error from the agent channel (host.Conn.Failure).
func (s *sandbox) failure(ctx context.Context, op string, err error) error {
	return s.ops().Failure(ctx, op, err)
}

// State implements runtime.Sandbox.
func (s *sandbox) State(ctx context.Context) (runtime.State, error) {
	m := s.meta()
	if m.Stopped {
		return runtime.StateStopped, nil
	}
	out, err := s.r.runscRun(ctx, "state", m.CID)
	if err != nil {
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		return runtime.StateStopped, nil // runsc knows no such container
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("parse runsc state: %w", err)
	}
	switch st.Status {
	case "running", "paused", "created":
		return runtime.StateRunning, nil
	}
	return runtime.StateStopped, nil
}

// Quiesce implements runtime.Sandbox: the agent syncs (gVisor flushes its
// page cache to the host files) and runsc pauses every task.
func (s *sandbox) Quiesce(ctx context.Context) (func(context.Context) error, error) {
	c, err := s.agent(ctx)
	if err != nil {
		return nil, s.failure(ctx, "quiesce", err)
	}
	if err := c.Sync(ctx); err != nil {
		return nil, s.failure(ctx, "quiesce", err)
	}
	cid := s.meta().CID
	if _, err := s.r.runscRun(ctx, "pause", cid); err != nil {
		return nil, fmt.Errorf("quiesce sandbox %s: %w", s.ID(), err)
	}
	var once sync.Once
	return func(ctx context.Context) error {
		var err error
		once.Do(func() {
			if _, rerr := s.r.runscRun(ctx, "resume", cid); rerr != nil {
				err = fmt.Errorf("resume sandbox %s: %w", s.ID(), rerr)
			}
		})
		return err
	}, nil
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
	m := s.meta()
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
	if s.meta().Disk {
		return allocatedBytes(s.path("disk.img"))
	}
	return dirSize(s.path("layer"))
}

// Stats implements runtime.Sandbox.
func (s *sandbox) Stats(ctx context.Context) (runtime.Stats, error) {
	m := s.meta()
	var out runtime.Stats
	if m.Disk {
		out.DiskBytes = diskUsage(s.path("layer"))
	} else {
		out.DiskBytes = dirSize(s.path("layer"))
	}
	if m.Stopped {
		return out, nil
	}
	cs, err := cgroup.New(m.CgroupPath).Stats()
	if err != nil {
		return out, fmt.Errorf("stats of sandbox %s: %w", m.ID, err)
	}
	out.MemoryBytes, out.CPU, out.Pids = cs.MemoryBytes, cs.CPU, cs.Pids
	if c := s.agentSlot.Client(); c != nil {
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
	m := s.meta()
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
		c := s.agentSlot.Client()
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
	s.detach()
	m := s.meta()
	var errs []error
	if _, err := s.r.runscRun(ctx, "delete", "--force", m.CID); err != nil && !strings.Contains(err.Error(), "does not exist") &&
		!strings.Contains(err.Error(), "not found") {
		errs = append(errs, err)
	}
	if err := unmount(s.path("rootfs")); err != nil {
		errs = append(errs, err)
	}
	s.mu.Lock()
	s.m.Stopped = true
	m = s.m
	gone := s.gone
	s.mu.Unlock()
	if !gone {
		if _, err := os.Stat(s.dir); err == nil {
			if err := writeMeta(s.dir, m); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", m.ID, err)
	}
	return nil
}

// Destroy implements runtime.Sandbox.
func (s *sandbox) Destroy(ctx context.Context) error {
	var errs []error
	if err := s.Stop(ctx); err != nil {
		errs = append(errs, err)
	}
	m := s.meta()
	if err := unmount(s.path("layer")); err != nil {
		errs = append(errs, err)
	}
	if g := cgroup.New(m.CgroupPath); g.Exists() {
		if err := g.Remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := s.r.table.Dir.Remove(s.dir, m.ID, m.CID); err != nil {
		errs = append(errs, err)
	}
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	s.r.table.Remove(m.CID, s)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", m.ID, err)
	}
	return nil
}
