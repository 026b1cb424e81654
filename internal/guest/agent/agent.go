// Package agent is the guest side of the guest protocol: the services the
// sandbox agent (cmd/sandbox-agent) offers the host over one connection —
// envd's process and filesystem services, file bodies over /files, and
// sandboxd's agent service (health, sync, the memory guard's kill, and a
// microVM's freeze, thaw, layer export and clock) — and the forwarding of
// in-sandbox connections home.
//
// Invariants: every process the agent starts runs in its own session (its
// pid is the session id), so a timeout, a signal or an OOM kill can take
// down the whole tree it started; a process outlives the connection that
// started it (the host comes back and Connects to it); in PID 1 mode
// (Options.Reap) the agent reaps every process in the sandbox and is the
// only caller of wait4. The agent never kills a process outside the
// sessions it started unless it is PID 1, where every process in the
// sandbox is its own.
package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
	"github.com/sandboxd/sandboxd/internal/guest/pb/filesystem/filesystemconnect"
	"github.com/sandboxd/sandboxd/internal/guest/pb/process/processconnect"
	agentv1 "github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/internal/guest/pb/sandboxd/agent/v1/agentv1connect"
)

// Options configure an Agent.
type Options struct {
	// Version is the agent build version reported in Hello.
	Version string
	// Reap makes the agent reap every child (it is PID 1 or a subreaper).
	// Without it each process is waited for individually, which is what a
	// test that runs the agent inside another program needs.
	Reap bool
	// Env is the environment every process starts with before the request's
	// own; nil means DefaultEnv.
	Env []string
	// Cwd is the working directory when a request gives none.
	Cwd string
	// UserDB is the directory whose passwd and group files hold the users
	// a request can act as (guest.UserHeader); default /etc.
	UserDB string
	Logger *slog.Logger
	// Cgroup, when set, is a cgroup v2 directory every process the agent
	// starts is placed in as it is cloned (a microVM's sandbox limits); the
	// agent stays outside it. OpFreeze and OpThaw act on it (vm.go).
	Cgroup string
	// Layer is the overlay upper directory OpExportLayer archives; empty
	// refuses the operation.
	Layer string
	// NetLink is the link ConfigureNetwork sets up (a microVM's eth0) and
	// ResolvConf the file it writes the nameservers to; without NetLink
	// the call is refused (the sandbox's network is the host's business).
	NetLink    string
	ResolvConf string
	// Secret answers the host's handshake challenge (a Proof): the
	// per-sandbox key the host gave this process alone, so that no other
	// process in the sandbox can take over the host's session.
	Secret []byte
	// TailBytes is how much of each output stream of a process the agent
	// keeps for a caller that reconnects (default DefaultTailBytes).
	TailBytes int
	// TTYSignals: this kernel's terminals send no signals for ^C, ^\ and
	// ^Z (gVisor before 2023), so processes on a terminal run under a
	// tty-session helper that sends them (see ttysignals.go).
	TTYSignals bool
	// MaxGzipBytes bounds what a gzip-encoded POST /files body
	// decompresses to, all its files together (default
	// DefaultMaxGzipBytes); past it the upload is refused with 413.
	MaxGzipBytes int64
}

// DefaultEnv is the base environment of processes the agent starts.
var DefaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
	"USER=root",
}

// Agent serves the guest protocol. One Agent serves one connection at a
// time; after the host goes away the caller dials again and calls Serve anew.
type Agent struct {
	opts  Options
	log   *slog.Logger
	boot  string
	start time.Time
	// umask is the process's file mode creation mask, read at the start.
	umask fs.FileMode
	procs *procTable
	// ttySelf is the agent binary a process on a terminal starts under
	// as its tty-session helper (Options.TTYSignals); "": none.
	ttySelf string
	vm      vmState
	mux     http.Handler
	watch   *watchers
	owners  owners
	code    *codeint.Interpreter
	netMu   sync.Mutex // one ConfigureNetwork at a time

	mu   sync.Mutex
	sess *yamux.Session
	// ready is closed while a session is up and replaced when it ends, so
	// OpenHome can wait for the host to (re)connect.
	ready chan struct{}
}

// New returns an Agent. In Reap mode it starts reaping children at once.
func New(opts Options) *Agent {
	if opts.Env == nil {
		opts.Env = DefaultEnv
	}
	if opts.Cwd == "" {
		opts.Cwd = "/"
	}
	if opts.UserDB == "" {
		opts.UserDB = "/etc"
	}
	if opts.TailBytes <= 0 {
		opts.TailBytes = DefaultTailBytes
	}
	if opts.MaxGzipBytes <= 0 {
		opts.MaxGzipBytes = DefaultMaxGzipBytes
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	a := &Agent{opts: opts, log: log, boot: hex.EncodeToString(b[:]), start: time.Now(), umask: processUmask(), procs: newProcTable(opts.Reap), watch: newWatchers(), ready: make(chan struct{})}
	a.code = codeint.New(a.launchShim, log.With("component", "code"), nil)
	a.mux = a.handler()
	if opts.TTYSignals {
		if self, err := os.Executable(); err != nil {
			log.Warn("terminal signals: the agent binary is not known; ^C stays input", "err", err)
		} else {
			a.ttySelf = self
		}
	}
	if opts.Reap {
		go a.procs.reapLoop()
	}
	return a
}

// handler routes the host's requests: the Connect services and the plain
// HTTP endpoints.
func (a *Agent) handler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{guest.HandlerNoCompression, connect.WithReadMaxBytes(guest.MaxMessage)}
	mux.Handle(processconnect.NewProcessHandler(processService{a}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(filesystemService{a}, opts...))
	mux.Handle(agentv1connect.NewAgentHandler(agentService{a}, opts...))
	mux.HandleFunc("GET "+guest.FilesPath, a.getFile)
	mux.HandleFunc("POST "+guest.FilesPath, a.postFile)
	mux.HandleFunc("POST "+guest.UnpackPath, a.postUnpack)
	mux.Handle(guest.CodePath+"/", http.StripPrefix(guest.CodePath, http.HandlerFunc(a.serveCode)))
	mux.HandleFunc("GET "+guest.HealthPath, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return mux
}

// Hello is what the agent announces on every connection.
func (a *Agent) Hello() guest.Hello {
	h := guest.Hello{Protocol: guest.Protocol, Agent: a.opts.Version, PID: os.Getpid(), Boot: a.boot}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
	}
	return h
}

// Serve runs the agent side of the handshake on conn and serves the host's
// requests until the session ends or ctx is done. Processes live on when
// it ends: the host finds them again on its next connection.
func (a *Agent) Serve(ctx context.Context, conn net.Conn) error {
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if err := guest.WriteMessage(conn, a.Hello().Message()); err != nil {
		conn.Close()
		return fmt.Errorf("send hello: %w", err)
	}
	var w agentv1.Welcome
	if err := guest.ReadMessage(conn, &w); err != nil {
		conn.Close()
		return fmt.Errorf("read welcome: %w", err)
	}
	if w.GetError() != "" {
		conn.Close()
		return fmt.Errorf("host refused agent: %s", w.GetError())
	}
	if len(w.GetChallenge()) > 0 {
		if len(w.GetChallenge()) > 4*guest.ChallengeSize {
			conn.Close()
			return fmt.Errorf("host challenge of %d bytes", len(w.GetChallenge()))
		}
		// Without a secret the proof is wrong and the host says so by
		// closing the connection.
		if err := guest.WriteMessage(conn, &agentv1.Proof{Mac: guest.ProofMAC(a.opts.Secret, w.GetChallenge())}); err != nil {
			conn.Close()
			return fmt.Errorf("send proof: %w", err)
		}
	}
	_ = conn.SetDeadline(time.Time{})
	sess, err := yamux.Server(conn, guest.YamuxConfig())
	if err != nil {
		conn.Close()
		return fmt.Errorf("start session: %w", err)
	}
	a.mu.Lock()
	a.sess = sess
	close(a.ready)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		if a.sess == sess {
			a.sess = nil
			a.ready = make(chan struct{})
		}
		a.mu.Unlock()
	}()
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	err = guest.ServeSession(sess, a.mux, a.log)
	sess.Close()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// homeWait is how long a connection home waits for the host to connect.
const homeWait = 10 * time.Second

// OpenHome opens a stream home on the current session, for one connection
// to sandboxd.internal. If the host is not connected (it is restarting) it
// waits for it a while.
func (a *Agent) OpenHome() (net.Conn, error) {
	a.mu.Lock()
	sess, ready := a.sess, a.ready
	a.mu.Unlock()
	if sess == nil {
		select {
		case <-ready:
		case <-time.After(homeWait):
			return nil, errors.New("host not connected")
		}
		a.mu.Lock()
		sess = a.sess
		a.mu.Unlock()
		if sess == nil {
			return nil, errors.New("host not connected")
		}
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("open home stream: %w", err)
	}
	return st, nil
}

// ServeHome accepts connections on ln (the sandbox's sandboxd.internal:80)
// and forwards each one home until ln is closed.
func (a *Agent) ServeHome(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("accept home connection: %w", err)
		}
		go func() {
			st, err := a.OpenHome()
			if err != nil {
				a.log.Warn("forward home", "err", err)
				c.Close()
				return
			}
			// The connection ends with its session: the other way it would
			// wait for the client inside, and an open connection keeps
			// gVisor from checkpointing the sandbox (see ListenHome),
			// which the host does right after ending the session.
			if ys, ok := st.(*yamux.Stream); ok {
				done := make(chan struct{})
				defer close(done)
				go func() {
					select {
					case <-ys.Session().CloseChan():
						c.Close()
					case <-done:
					}
				}()
			}
			guest.Splice(c, st)
		}()
	}
}

// HandleSignals makes a PID 1 agent exit on SIGTERM/SIGINT (what `runsc
// kill` sends), so the sandbox stops; PID 1 gets no default handlers.
func HandleSignals(cancel context.CancelFunc) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-ch
		cancel()
	}()
}
