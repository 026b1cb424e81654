package agent_test

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/agent"
)

// TestMain lets the test binary be the agent binary where the agent runs
// itself: the tty-session helper and the terminal probe's child.
func TestMain(m *testing.M) {
	switch {
	case len(os.Args) > 1 && os.Args[1] == agent.TTYSessionMode:
		os.Exit(agent.TTYSession(os.Args[2:]))
	case len(os.Args) > 2 && os.Args[1] == "version" && os.Args[2] == agent.TTYProbeChildArg:
		os.Exit(agent.TTYProbeChild())
	}
	os.Exit(m.Run())
}

// TestProbeTTYSignals: on Linux, whose terminals send SIGINT for ^C, the
// probe says so.
func TestProbeTTYSignals(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if got := agent.ProbeTTYSignals(self); got != "ok" {
		t.Fatalf("probe on Linux: %q, want ok", got)
	}
}

// TestTTYSignals: with Options.TTYSignals a process on a terminal runs
// under the tty-session helper, and the agent turns the interrupt
// character of its input into SIGINT for the terminal's foreground group
// (taking it out of the input, so only the helper can have sent it): the
// command ends by it, as would an interactive shell's foreground job
// while the shell lives on; with the terminal's ISIG off it is input.
// What the command exits with reaches the host as it was.
func TestTTYSignals(t *testing.T) {
	c := ttyAgent(t)
	// run runs cmd on a terminal and calls send with a way to type and
	// the output; sid is the process's session, killed whole when the
	// test ends.
	run := func(t *testing.T, cmd string, send func(write func(string), out *syncBuffer, sid int)) (guest.Exit, string) {
		t.Helper()
		in, input := io.Pipe()
		defer input.Close()
		out := &syncBuffer{}
		done := make(chan guest.Exit, 1)
		started := make(chan int, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			e, err := c.Exec(ctx, guest.ExecSpec{Cmd: []string{"sh", "-c", cmd}, TTY: true, Stdin: true},
				guest.ExecIO{Stdin: in, Stdout: out, Started: func(pid int, _ guest.Offsets) { started <- pid }})
			if err != nil {
				t.Error(err)
			}
			done <- e
		}()
		sid := <-started
		t.Cleanup(func() { _ = syscall.Kill(-sid, syscall.SIGKILL) })
		send(func(s string) {
			if _, err := io.WriteString(input, s); err != nil {
				t.Error(err)
			}
		}, out, sid)
		e := <-done
		return e, out.String()
	}
	t.Run("interrupt", func(t *testing.T) {
		e, out := run(t, "echo ready; sleep 600; echo not-interrupted", func(write func(string), out *syncBuffer, _ int) {
			waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
			write("\x03")
		})
		if e.Code != 130 || e.Signal != int(syscall.SIGINT) || strings.Contains(out, "not-interrupted") {
			t.Fatalf("after ^C: %+v, output %q", e, out)
		}
	})
	t.Run("isig off", func(t *testing.T) {
		e, out := run(t, "stty -isig -icanon; echo ready; head -c1 | od -An -tx1", func(write func(string), out *syncBuffer, _ int) {
			waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
			write("\x03")
		})
		if e.Code != 0 || !strings.Contains(out, " 03") {
			t.Fatalf("^C with ISIG off: %+v, output %q, want the byte 03 read", e, out)
		}
	})
	t.Run("job", func(t *testing.T) {
		const sleep = "sleep 600"
		e, out := run(t, "exec sh -i", func(write func(string), out *syncBuffer, sid int) {
			write(sleep + "\n")
			waitFor(t, func() bool { return running(sleep, sid) })
			write("\x03")
			write("echo after-$((6*7))\n")
			waitFor(t, func() bool { return strings.Contains(out.String(), "after-42") })
			write("exit 0\n")
		})
		if e.Code != 0 {
			t.Fatalf("the shell after ^C: %+v, output %q", e, out)
		}
	})
	t.Run("exit", func(t *testing.T) {
		e, out := run(t, "kill -TERM $$", func(func(string), *syncBuffer, int) {})
		if e.Code != 128+int(syscall.SIGTERM) || e.Signal != int(syscall.SIGTERM) {
			t.Fatalf("a command killed by SIGTERM: %+v, output %q", e, out)
		}
	})
}

// ttyAgent is an in-process agent with Options.TTYSignals (its helper is
// this test binary: see TestMain) and the host's client to it.
func ttyAgent(t *testing.T) *guest.Client {
	t.Helper()
	secret := []byte("s")
	dir := t.TempDir()
	ln, err := net.Listen("unix", filepath.Join(dir, "agent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	a := agent.New(agent.Options{Version: "test", Cwd: dir, Secret: secret, TTYSignals: true})
	c, err := connectAgent(t, a, ln, guest.ClientOptions{Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// running says a process with command line cmd runs in session sid.
func running(cmd string, sid int) bool {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || strings.TrimRight(strings.ReplaceAll(string(b), "\x00", " "), " ") != cmd {
			continue
		}
		// stat: pid (comm) state ppid pgrp session ...
		st, err := os.ReadFile(filepath.Join(p, "stat"))
		if i := strings.LastIndexByte(string(st), ')'); err == nil && i > 0 {
			if f := strings.Fields(string(st)[i+1:]); len(f) > 3 && f[3] == strconv.Itoa(sid) {
				return true
			}
		}
	}
	return false
}
