// Command sandbox-agent runs inside every sandbox as its first process (PID 1
// under gVisor). It dials the host over a unix socket that the runtime mounts
// into the sandbox, speaks the guest protocol (internal/guest) on that one
// connection, reaps orphans, and forwards connections to
// sandboxd.internal:80 home. When the host goes away (sandboxd restarts) it
// keeps its processes and dials again until the host is back. In a microVM
// it runs as vm-init and vm-agent instead (internal/guest/vminit).
//
// It must be a static binary (CGO_ENABLED=0): it runs on whatever root
// filesystem the sandbox has.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/agent"
	"github.com/sandboxd/sandboxd/internal/guest/vminit"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if filepath.Base(os.Args[0]) == "sudo" {
		// Mounted over the image's sudo on gVisor (see agent.SudoMain).
		os.Exit(agent.SudoMain(os.Args[1:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "version" {
		fmt.Printf("sandbox-agent %s protocol %d\n", version, guest.Protocol)
		switch {
		case len(os.Args) > 2 && os.Args[2] == "--probe":
			probe()
		case len(os.Args) > 2 && os.Args[2] == agent.TTYProbeChildArg:
			os.Exit(agent.TTYProbeChild())
		case len(os.Args) > 2 && os.Args[2] == "--wait":
			// A process to save and restore: the gVisor backend's
			// trial of a runsc's checkpoint (see gvisor's saveprobe.go),
			// which takes seconds. Bounded, so that a trial whose
			// sandboxd died leaves no container running for long.
			time.Sleep(5 * time.Minute)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == agent.TTYSessionMode {
		os.Exit(agent.TTYSession(os.Args[2:])) // the session leader of a terminal (see --tty-signals)
	}
	if len(os.Args) > 1 && (os.Args[1] == vminit.ModeInit || os.Args[1] == vminit.ModeAgent) {
		os.Exit(vminit.Main(os.Args[1], version, os.Args[2:])) // microVM modes
	}
	// Before anything else: no other process may ever see the secret.
	secret := takeSecret()
	socket := flag.String("socket", "/run/sandboxd/sock/agent.sock", "host socket to dial")
	home := flag.String("home", "127.0.0.1:80", "address to forward home (sandboxd.internal); empty disables")
	cwd := flag.String("cwd", "/workspace", "default working directory, created if missing")
	debug := flag.Bool("debug", false, "log debug messages")
	tail := flag.Int("output-tail-bytes", agent.DefaultTailBytes, "bytes of each output stream of a process kept for a caller that reconnects")
	ttySignals := flag.Bool("tty-signals", false, "send the signals of ^C, ^\\ and ^Z on terminals: the kernel's terminals do not (gVisor before 2023)")
	flag.Parse()

	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("agent", version)
	if err := run(log, *socket, *home, *cwd, agent.Options{TailBytes: *tail, Secret: secret, TTYSignals: *ttySignals}); err != nil {
		log.Error("sandbox-agent failed", "err", err)
		os.Exit(1)
	}
}

// run serves the host on socket until the agent is told to stop; opts
// are the flags' (its Version, Reap, Cwd and Logger are run's).
func run(log *slog.Logger, socket, home, cwd string, opts agent.Options) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pid1 := os.Getpid() == 1
	if pid1 {
		agent.HandleSignals(cancel)
	} else {
		// Not init: become a subreaper so orphans of our sessions are ours
		// to reap rather than leaking to the real init.
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	if err := os.MkdirAll(cwd, 0o755); err != nil {
		log.Warn("create default working directory", "dir", cwd, "err", err)
	}
	opts.Version, opts.Reap, opts.Cwd, opts.Logger = version, true, cwd, log
	a := agent.New(opts)
	if pid1 {
		// sudo without setuid, for the image's sudoers (gVisor honours
		// no setuid bit; the runtime mounts this binary over sudo).
		go func() {
			if err := a.ServeSudo(ctx, agent.SudoSocket); err != nil {
				log.Warn("sudo not served", "err", err)
			}
		}()
	}
	if home != "" {
		ln, err := agent.ListenHome(home)
		if err != nil {
			log.Warn("listen for sandboxd.internal", "addr", home, "err", err)
		} else {
			defer ln.Close()
			go func() {
				if err := a.ServeHome(ln); err != nil {
					log.Warn("home forwarding stopped", "err", err)
				}
			}()
		}
	}
	// Dial the host forever: at boot it is already listening; after a host
	// restart it comes back on the same path.
	backoff := 5 * time.Millisecond
	for ctx.Err() == nil {
		conn, err := net.Dial("unix", socket)
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 500*time.Millisecond)
			continue
		}
		backoff = 5 * time.Millisecond
		log.Debug("connected to host")
		if err := a.Serve(ctx, conn); err != nil && ctx.Err() == nil {
			log.Warn("session ended", "err", err)
		}
	}
	return nil
}

// probe reports what the gVisor backend's trial sandbox asks about the
// kernel it runs on (see gvisor's platform.go): whether statx accepts
// AT_NO_AUTOMOUNT, which coreutils 9 passes and runsc before 2023 rejects
// with EINVAL (the backend then preloads its statx shim); and whether its
// terminals send SIGINT for ^C, which runsc before 2023's do not (the
// backend then starts the agent with --tty-signals).
func probe() {
	var st unix.Statx_t
	res := "ok"
	if err := unix.Statx(unix.AT_FDCWD, "/", unix.AT_NO_AUTOMOUNT|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &st); err != nil {
		res = err.Error()
	}
	fmt.Printf("statx-no-automount: %s\n", res)
	self, err := os.Executable()
	tty := "unknown (" + fmt.Sprint(err) + ")"
	if err == nil {
		tty = agent.ProbeTTYSignals(self)
	}
	fmt.Printf("tty-signals: %s\n", tty)
}
