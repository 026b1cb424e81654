package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/cgroup"
	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Pause and resume with gVisor's checkpoint/restore. Pause has the agent
// sync, ends the host's session with it so that the sandbox holds no host
// socket (see disconnect), then `runsc checkpoint` writes the sentry's
// memory and state into checkpoint/ and the sandbox's processes end; its
// cgroup goes once they have. The bundle, the rootfs overlay and the
// writable layer's disk stay as they are: restore reopens the same paths.
// Resume deletes runsc's record of the stopped container (restore makes it
// again under the same id), listens again and runs `runsc restore` from
// the same bundle, which makes the cgroup again; the memory guard starts
// on it. The restored agent is still in its loop dialling home, finds the
// socket answering and starts a new session (its processes, with their
// output kept, are the ones it had).

// checkpointDir is where a paused sandbox's saved state lives, in its
// state directory.
const checkpointDir = "checkpoint"

var _ runtime.SaveSizer = (*Runtime)(nil)

// checkpointSlack is what an image may add to the memory it saves: its
// own framing and the kernel's objects as encoded.
const checkpointSlack = 32 << 20

// MaxSaveBytes implements runtime.SaveSizer. A checkpoint (a pause's, or
// the one a fork restores from) holds the sentry's memory file and its
// kernel's state, all memory of the sandbox's host cgroup, which
// hardLimits caps: the memory guard acts at Limits.MemoryBytes, but a
// runaway may reach the hard cap first. (A sandbox holding 256 MiB wrote a
// 262 MiB image.)
func (r *Runtime) MaxSaveBytes(l runtime.Limits) int64 {
	memHard, _ := hardLimits(l, 0)
	if memHard == 0 {
		return 0
	}
	return memHard + checkpointSlack
}

// Pause implements runtime.Pauser.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	s, err := r.Table().Get(id)
	if err != nil {
		return err
	}
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	if err := s.pause(ctx); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	s, err := r.Table().Get(id)
	if err != nil {
		return err
	}
	s.OpMu.Lock()
	defer s.OpMu.Unlock()
	if err := s.resume(ctx); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}

// pause checkpoints the running container; callers hold OpMu. A runsc
// that failed the save trial (saveprobe.go) is refused before anything
// is touched.
func (s *sandbox) pause(ctx context.Context) error {
	start := time.Now()
	m := s.Meta()
	if _, err := s.r.savable(ctx, m); err != nil {
		return err
	}
	if err := s.readyToSave(ctx); err != nil {
		return err
	}
	dir := s.Path(checkpointDir)
	_ = os.RemoveAll(dir) // a failed earlier attempt's
	if err := os.Mkdir(dir, 0o700); err != nil {
		return s.reattachAfter(err)
	}
	t0 := time.Now()
	if _, err := s.r.runscRun(ctx, m, "checkpoint", "--image-path", dir, m.CID); err != nil {
		// The sentry ends the sandbox after a save that failed too; one
		// refused before it began leaves it running, served again.
		_ = os.RemoveAll(dir)
		return s.reattachAfter(err)
	}
	saved := time.Since(t0)
	// Its memory is on disk and its processes end: it is paused now,
	// whatever the cleanup below says.
	if err := s.SetMeta(func(m *meta) { m.Paused = true }); err != nil {
		return err
	}
	// runsc's record of the container stays until Resume deletes it (to
	// restore under the same id) or Destroy does. Its processes (sentry,
	// gofer, the platform's stubs) end by themselves once it is saved;
	// they are all in its cgroup, which goes when they have.
	var errs []error
	if err := endCgroup(m.CgroupPath, 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	s.r.log.Info("sandbox paused", "id", m.ID, "cid", m.CID,
		"checkpoint", saved.Round(time.Millisecond), "elapsed", time.Since(start).Round(time.Millisecond),
		"image_bytes", dirSize(dir))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("after checkpoint: %w", err)
	}
	return nil
}

// readyToSave readies a running container to have its memory saved
// (pause, fork): what the guest wrote goes to the host's disk, not only
// into gVisor's page cache, which is saved with its memory (the writable
// layer is then whole on its own: Snapshot of a paused sandbox reads it,
// and a fork copies it); sockets the runsc cannot save are refused; the
// agent's session ends (disconnect). On failure it is served again.
func (s *sandbox) readyToSave(ctx context.Context) error {
	if st, err := s.State(ctx); err != nil {
		return err
	} else if st != runtime.StateRunning {
		return fmt.Errorf("%w (%s)", runtime.ErrNotRunning, st)
	}
	if _, err := s.Call(ctx, "sync", func(c *guest.Client) error { return c.Sync(ctx) }); err != nil {
		return err
	}
	if err := s.checkSockets(ctx); err != nil {
		return err
	}
	if err := s.disconnect(ctx); err != nil {
		return s.reattachAfter(err)
	}
	return nil
}

// checkSockets refuses to save a sandbox (pause, fork) whose runsc is as
// old as Debian 12's while TCP sockets are open inside (as gVisor's
// /proc/net/tcp lists them: sockets some process holds), but sandboxd's
// own (see blocksSave). Debian's runsc 20221219 cannot save a TCP
// endpoint that an epoll set watches ("endpoint still has waiters upon
// save"), as every socket of a Go, Node or Python asyncio program is,
// and the sentry ends the sandbox after a failed save: a refusal leaves
// it running. Whether an epoll set watches a socket cannot be told from
// outside, so this refuses some sockets that would have saved. The
// current runsc saves them: listeners and connections open inside carry
// over (a connection to a peer outside the sandbox is restored too, but
// the peer may have dropped it meanwhile). The refusal names each socket
// readably ("127.0.0.1:24429 → 127.0.0.1:80 ESTABLISHED").
func (s *sandbox) checkSockets(ctx context.Context) error {
	if !s.oldRunsc() {
		return nil
	}
	var open []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		rc, err := s.ReadFile(ctx, f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		b, err := io.ReadAll(io.LimitReader(rc, 1<<20))
		rc.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		for _, sock := range parseTCPTable(string(b)) {
			if sock.blocksSave() {
				open = append(open, sock.String())
			}
		}
	}
	switch len(open) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: a TCP socket is open inside (%s), which the December 2022 gVisor this sandbox runs on cannot save; close it and try again (a current gVisor saves it)",
			runtime.ErrCannotPause, open[0])
	}
	return fmt.Errorf("%w: %d TCP sockets are open inside (%s), which the December 2022 gVisor this sandbox runs on cannot save; close them and try again (a current gVisor saves them)",
		runtime.ErrCannotPause, len(open), strings.Join(open, ", "))
}

// CheckSave implements runtime.SaveChecker: whether the sandbox's runsc
// can save at all (its save trial), and on Debian's 2022 runsc whether
// sockets inside keep it from being saved now.
func (r *Runtime) CheckSave(ctx context.Context, id string) error {
	s, err := r.Table().Get(id)
	if err != nil {
		return err
	}
	m := s.Meta()
	if _, err := r.savable(ctx, m); err != nil {
		return err
	}
	if m.Paused {
		return nil // its sockets were saved with it
	}
	return s.checkSockets(ctx)
}

// oldRunsc says the sandbox runs on a runsc as old as Debian 12's
// (December 2022): the node's chosen runsc when it needs the statx shim
// (only that one does), or a runsc other than the node's chosen one (a
// sandbox made before the current gVisor was installed: Debian's).
func (s *sandbox) oldRunsc() bool {
	m := s.Meta()
	if m.Runsc != "" && m.Runsc != s.r.runsc.Path {
		return true
	}
	if m.Runsc == "" && s.r.legacyRunsc != s.r.runsc.Path {
		return true
	}
	return s.r.runsc.StatxShim
}

// disconnect ends the agent's session and makes sure that the sandbox
// holds no host socket any more before it is saved. The runsc of Debian 12
// cannot save a socket connected to a host socket (--host-uds): its state
// encoder panics on the endpoint, and a failed save ends the sandbox. So
// the agent socket stops listening first (the path goes: the agent's
// redials fail from then on), handshakes under way end, and then the
// session is half-closed: the agent reads the end, closes its end of the
// connection and dials again (in vain), and the host reads that close.
// The agent also closes its connections home when its session ends
// (sandbox-agent: gVisor cannot save a TCP socket in use either); a short
// grace lets it finish.
//
// A process inside that connects to the agent socket itself and keeps the
// connection open after the host closed its end still makes the save fail.
func (s *sandbox) disconnect(ctx context.Context) error {
	s.Mu.Lock()
	l := s.listening
	s.Mu.Unlock()
	if l != nil {
		l.ln.Close()
		done := make(chan struct{})
		go func() {
			l.wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.Mu.Lock()
	pc := s.session
	s.Mu.Unlock()
	if pc != nil {
		_ = pc.CloseWrite()
		select {
		case <-pc.eof:
		case <-time.After(disconnectTimeout):
			return fmt.Errorf("the agent did not close its session within %v", disconnectTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.Detach()
	time.Sleep(homeGrace)
	return nil
}

const (
	// disconnectTimeout bounds the wait for the agent to close its end.
	disconnectTimeout = 5 * time.Second
	// homeGrace is how long the agent is given to close its connections
	// home after its session ended.
	homeGrace = 50 * time.Millisecond
)

// peerConn is a connection on the agent socket that says when the
// sandbox closed its end: eof is closed once a Read found the end.
type peerConn struct {
	net.Conn
	once sync.Once
	eof  chan struct{}
}

func newPeerConn(c net.Conn) *peerConn { return &peerConn{Conn: c, eof: make(chan struct{})} }

// Read implements net.Conn.
func (c *peerConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if errors.Is(err, io.EOF) {
		c.once.Do(func() { close(c.eof) })
	}
	return n, err
}

// CloseWrite half-closes the connection: the sandbox reads its end.
func (c *peerConn) CloseWrite() error {
	if uc, ok := c.Conn.(*net.UnixConn); ok {
		return uc.CloseWrite()
	}
	return c.Conn.Close()
}

// reattachAfter serves the sandbox again after a pause that failed before
// its container stopped, and returns err.
func (s *sandbox) reattachAfter(err error) error {
	if st, serr := s.State(context.Background()); serr == nil && st == runtime.StateRunning {
		if aerr := s.attach(); aerr != nil {
			return errors.Join(err, aerr)
		}
		s.startGuard()
	}
	return err
}

// resume restores the paused container; callers hold OpMu.
func (s *sandbox) resume(ctx context.Context) error {
	start := time.Now()
	m := s.Meta()
	if !m.Paused || m.Stopped {
		return fmt.Errorf("not paused (stopped: %v)", m.Stopped)
	}
	dir := s.Path(checkpointDir)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("saved state: %w", err)
	}
	network := "none"
	if m.Network != nil {
		network = "sandbox"
	}
	logw, err := s.LogPipe(agentFIFO)
	if err != nil {
		return err
	}
	defer logw.Close()
	if err := s.attach(); err != nil {
		return err
	}
	fail := func(err error) error {
		// The saved state stays: the sandbox is still paused, and a
		// later Resume may try again (or Destroy removes it).
		s.Detach()
		dctx := context.WithoutCancel(ctx)
		if _, derr := s.r.runscRun(dctx, m, "delete", "--force", m.CID); derr != nil && !notFound(derr) {
			err = errors.Join(err, derr)
		}
		if cerr := endCgroup(m.CgroupPath, 10*time.Second); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return err
	}
	// runsc still has the checkpointed container (stopped); restore
	// makes it again under the same id.
	if _, err := s.r.runscRun(ctx, m, "delete", "--force", m.CID); err != nil && !notFound(err) {
		return fail(err)
	}
	if err := readdress(m.Network); err != nil {
		return fail(err)
	}
	t0 := time.Now()
	cmd := s.r.runscFor(ctx, m, network, "restore", "--image-path", dir, "--bundle", s.Path("bundle"), "--detach", m.CID)
	cmd.Stdout, cmd.Stderr = logw, logw // an *os.File: see start
	before := logSize(s.Path("agent.log"))
	if err := cmd.Run(); err != nil {
		return fail(runscFailed("restore", err, s.Path("agent.log"), before))
	}
	restored := time.Since(t0)
	// Not paused any more: the agent's session is waited for, and the
	// memory guard watches the cgroup restore made.
	s.Mu.Lock()
	s.M.Paused = false
	s.Mu.Unlock()
	s.startGuard()
	wctx, cancel := context.WithTimeout(ctx, s.r.StartTimeout())
	defer cancel()
	if _, err := s.agent(wctx); err != nil {
		s.Mu.Lock()
		s.M.Paused = true
		s.Mu.Unlock()
		return fail(fmt.Errorf("wait for agent: %w", err))
	}
	if err := s.SetMeta(func(m *meta) { m.Paused = false }); err != nil {
		return err
	}
	size := dirSize(dir)
	if err := os.RemoveAll(dir); err != nil {
		s.r.log.Warn("remove checkpoint", "id", m.ID, "err", err)
	}
	s.r.log.Info("sandbox resumed", "id", m.ID, "cid", m.CID,
		"restore", restored.Round(time.Millisecond), "elapsed", time.Since(start).Round(time.Millisecond),
		"image_bytes", size)
	return nil
}

// endCgroup waits for the processes in the sandbox's cgroup to end, and
// removes it.
func endCgroup(path string, timeout time.Duration) error {
	g := cgroup.New(path)
	if err := g.Wait(timeout); err != nil {
		return fmt.Errorf("the sandbox's processes: %w", err)
	}
	return g.Remove()
}

// notFound says runsc failed because it knows no such container.
func notFound(err error) bool {
	return strings.Contains(err.Error(), "does not exist") || strings.Contains(err.Error(), "not found")
}

// dropCheckpoint removes a paused sandbox's saved state.
func (s *sandbox) dropCheckpoint() error {
	if err := os.RemoveAll(s.Path(checkpointDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove checkpoint: %w", err)
	}
	return nil
}
