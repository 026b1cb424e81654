package runtimetest

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testTerminalSignals runs TerminalSignals on the backend's sandbox.
func (s *suite) testTerminalSignals(t *testing.T) {
	TerminalSignals(t, s.create(t, runtime.Spec{}))
}

// TerminalSignals checks, in sb, that ^C typed on a terminal interrupts
// what runs in its foreground, as on a Linux terminal: a command that
// runs sleep itself ends with it (SIGINT: exit code 130), and in an
// interactive shell with job control (which gives the terminal's
// foreground to each job) the job's sleep ends while the shell lives on
// and runs the next line. The ^C is the byte a terminal client sends
// (0x03), written to the process's input.
func TerminalSignals(t *testing.T, sb runtime.Sandbox) {
	t.Run("command", func(t *testing.T) {
		in, input := io.Pipe()
		defer input.Close()
		out := &syncBuffer{}
		done := make(chan execOut, 1)
		go func() {
			res, err := sb.Exec(ctxT(t, time.Minute), runtime.ExecRequest{
				Cmd: []string{"sh", "-c", "sleep 600; echo not-interrupted"}, TTY: true, Stdin: in, Stdout: out})
			done <- execOut{res: res, err: err}
		}()
		waitSleeping(t, sb)
		if _, err := input.Write([]byte{0x03}); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil || o.res.ExitCode != 130 || strings.Contains(out.String(), "not-interrupted") {
			t.Fatalf("after ^C: %+v %v, output %q: want sleep and its shell ended by SIGINT (130)", o.res, o.err, out.String())
		}
	})
	t.Run("job", func(t *testing.T) {
		in, input := io.Pipe()
		defer input.Close()
		out := &syncBuffer{}
		done := make(chan execOut, 1)
		go func() {
			res, err := sb.Exec(ctxT(t, time.Minute), runtime.ExecRequest{Cmd: []string{"sh", "-i"}, TTY: true, Stdin: in, Stdout: out})
			done <- execOut{res: res, err: err}
		}()
		write := func(s string) {
			t.Helper()
			if _, err := io.WriteString(input, s); err != nil {
				t.Fatal(err)
			}
		}
		write("sleep 600\n")
		waitSleeping(t, sb)
		write("\x03")
		write("echo after-$((6*7))\n")
		waitOutput(t, out, "after-42")
		write("exit 0\n")
		if o := <-done; o.err != nil || o.res.ExitCode != 0 {
			t.Fatalf("the shell after ^C: %+v %v, output %q", o.res, o.err, out.String())
		}
	})
}

// waitSleeping waits until a `sleep 600` runs in sb: the process itself,
// not a shell whose command line names it.
func waitSleeping(t *testing.T, sb runtime.Sandbox) {
	t.Helper()
	const find = `for f in /proc/[0-9]*/cmdline; do [ "$(tr '\0' ' ' < $f 2>/dev/null)" = "sleep 600 " ] && echo found; done; true`
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(sh(t, sb, find), "found") {
		if time.Now().After(deadline) {
			t.Fatal("sleep 600 never ran")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
