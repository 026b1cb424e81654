package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// Terminal signals where the kernel sends none. A pseudo-terminal's line
// discipline turns the interrupt, quit and suspend characters (^C, ^\,
// ^Z) into SIGINT, SIGQUIT and SIGTSTP for the terminal's foreground
// process group. gVisor before 2023 (Debian 12's runsc) does not: ^C
// reaches the reader as a byte, so Ctrl-C in an interactive session did
// nothing. Its terminals cannot tell their foreground group to a process
// outside their session either (TIOCGPGRP answers only a process the
// terminal controls), and an interactive shell moves the foreground from
// job to job. So with Options.TTYSignals a process on a terminal starts
// under a session leader of the agent's own, `sandbox-agent tty-session`
// (TTYSession): it takes the terminal as its controlling terminal, runs
// the command as its child in its session, and on the agent's word (a
// signal number on a pipe) asks the terminal for its foreground group,
// which it may, and signals that group. The agent, writing the input,
// takes those characters out while the terminal's ISIG is on, as the line
// discipline would, and has the helper send the signals; a resize sends
// SIGWINCH the same way. Whether a kernel needs this is found by trial
// (ProbeTTYSignals), by the gVisor backend's probe of its runsc.

// TTYSessionMode is the agent's argument that runs TTYSession.
const TTYSessionMode = "tty-session"

// ttyControlFD is the helper's descriptor of the agent's pipe.
const ttyControlFD = 3

// ttySignaller is the agent's end of a process's tty-session helper.
type ttySignaller struct {
	mu sync.Mutex
	w  *os.File // nil once closed
}

// send asks the helper to signal the terminal's foreground group.
func (s *ttySignaller) send(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil {
		_, _ = s.w.Write([]byte{byte(sig)})
	}
}

func (s *ttySignaller) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != nil {
		s.w.Close()
		s.w = nil
	}
}

// underTTYSession makes cmd (a command with argv, on a terminal) run
// under the tty-session helper, the agent binary at self, and returns the
// helper's end of the pipe, to close once cmd started, and the agent's.
func underTTYSession(cmd *exec.Cmd, self string, argv []string) (helperEnd *os.File, s *ttySignaller, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Args = append([]string{self, TTYSessionMode, cmd.Path}, argv...)
	cmd.Path = self
	cmd.ExtraFiles = []*os.File{r} // ttyControlFD
	return r, &ttySignaller{w: w}, nil
}

// ttySignalChars are the characters a line discipline turns into signals,
// by their index in termios c_cc.
var ttySignalChars = []struct {
	index int
	sig   syscall.Signal
}{{unix.VINTR, syscall.SIGINT}, {unix.VQUIT, syscall.SIGQUIT}, {unix.VSUSP, syscall.SIGTSTP}}

// writeTTY writes input to the terminal f of a process under a
// tty-session helper: while the terminal's ISIG is on, its interrupt,
// quit and suspend characters become signals for its foreground group
// instead of input, as a line discipline that sends them would do.
func writeTTY(f *os.File, s *ttySignaller, b []byte) error {
	t, err := getTermios(f)
	if err != nil || t.Lflag&unix.ISIG == 0 {
		_, err := f.Write(b)
		return err
	}
	sigs := map[byte]syscall.Signal{}
	for _, c := range ttySignalChars {
		if ch := t.Cc[c.index]; ch != 0 { // 0: _POSIX_VDISABLE
			sigs[ch] = c.sig
		}
	}
	start := 0
	for i, c := range b {
		sig, ok := sigs[c]
		if !ok {
			continue
		}
		if err := writeSome(f, b[start:i]); err != nil {
			return err
		}
		s.send(sig)
		start = i + 1
	}
	return writeSome(f, b[start:])
}

// writeSome writes b unless it is empty: gVisor's terminal master answers
// a write of nothing with EAGAIN, which the poller would wait out forever.
func writeSome(f *os.File, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := f.Write(b)
	return err
}

// getTermios reads a terminal's settings without os.File.Fd (see
// setWinsize).
func getTermios(f *os.File) (*unix.Termios, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var t *unix.Termios
	cerr := rc.Control(func(fd uintptr) { t, err = unix.IoctlGetTermios(int(fd), unix.TCGETS) })
	if cerr != nil {
		return nil, cerr
	}
	return t, err
}

// TTYSession is `sandbox-agent tty-session PATH ARGV...`, the session
// leader the agent starts a process on a terminal under when its kernel's
// terminals send no signals: it runs PATH with ARGV as its child, in its
// session and process group, on its terminal and environment; sends each
// signal the agent writes on descriptor 3 to the terminal's foreground
// group; and exits as the child did.
func TTYSession(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: sandbox-agent tty-session PATH ARGV...")
		return 2
	}
	unix.CloseOnExec(ttyControlFD)
	ctl := os.NewFile(ttyControlFD, "tty-signals")
	// Caught, not ignored, so that the command starts with the default
	// dispositions; the helper itself is never stopped or ended by what
	// its terminal's foreground group gets (it is in that group until a
	// shell moves its jobs).
	caught := make(chan os.Signal, 8)
	signal.Notify(caught, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
		syscall.SIGHUP, syscall.SIGTERM, syscall.SIGWINCH)
	go func() {
		for range caught {
		}
	}()
	cmd := &exec.Cmd{Path: args[0], Args: args[1:], Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "sandbox-agent: %s: %v\n", args[1], err)
		return 126
	}
	go forwardTTYSignals(ctl)
	_ = cmd.Wait()
	signal.Stop(caught)
	return exitAs(cmd.ProcessState)
}

// forwardTTYSignals sends each signal read from ctl to the foreground
// group of the terminal on descriptor 0, until ctl ends.
func forwardTTYSignals(ctl io.Reader) {
	buf := make([]byte, 16)
	for {
		n, err := ctl.Read(buf)
		for _, b := range buf[:n] {
			pgrp, gerr := unix.IoctlGetInt(0, unix.TIOCGPGRP)
			if gerr != nil || pgrp <= 0 {
				pgrp = unix.Getpgrp()
			}
			_ = unix.Kill(-pgrp, syscall.Signal(b))
		}
		if err != nil {
			return
		}
	}
}

// exitAs ends the helper the way its child ended, so that the agent sees
// the child's status: its exit code, or death by the same signal where
// the Go runtime dies of it when nothing handles it (SIGHUP, SIGINT,
// SIGTERM; SIGKILL), else the shell's 128+signal.
func exitAs(ps *os.ProcessState) int {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return ps.ExitCode()
	}
	sig := ws.Signal()
	switch sig {
	case syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGKILL:
		signal.Reset(sig)
		_ = unix.Kill(os.Getpid(), sig)
		time.Sleep(time.Second) // the signal ends the process first
	}
	return 128 + int(sig)
}

// The probe of a kernel's terminals: the agent on a pseudo-terminal runs
// itself as a child that reads a line, writes ^C then a newline, and the
// child says whether a SIGINT came and the ^C was taken out of its input
// (the kernel sends terminal signals) or the ^C came in as a byte (it
// does not). Deterministic: a kernel that sends it does so while the ^C
// is written, before the newline that ends the child's read.
const (
	// TTYProbeChildArg is the argument of `sandbox-agent version` that
	// runs TTYProbeChild.
	TTYProbeChildArg  = "--tty-probe-child"
	ttyProbeSignalled = 0
	ttyProbeByte      = 3
)

// ProbeTTYSignals says whether this kernel's terminals send SIGINT for ^C:
// "ok", "none (...)" when they do not, or "unknown (...)" when the probe
// could not tell. self is the agent binary.
func ProbeTTYSignals(self string) string {
	cmd := exec.Command(self, "version", TTYProbeChildArg)
	ptmx, err := pty.Start(cmd)
	if err != nil {
		return fmt.Sprintf("unknown (start the probe on a terminal: %v)", err)
	}
	defer ptmx.Close()
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(ptmx)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "ready" {
				close(ready)
				break
			}
		}
		_, _ = io.Copy(io.Discard, ptmx) // the echo, until the child ends
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-ready:
	case err := <-exited:
		return fmt.Sprintf("unknown (the probe ended before it read: %v)", err)
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		return "unknown (the probe did not start)"
	}
	if _, err := ptmx.Write([]byte("\x03\n")); err != nil {
		_ = cmd.Process.Kill()
		return fmt.Sprintf("unknown (write to the terminal: %v)", err)
	}
	var werr error
	select {
	case werr = <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		return "unknown (the probe did not end)"
	}
	var exit *exec.ExitError
	switch {
	case werr == nil:
		return "ok"
	case errors.As(werr, &exit) && exit.ExitCode() == ttyProbeByte:
		return "none (^C reached the reader as input)"
	}
	return fmt.Sprintf("unknown (the probe: %v)", werr)
}

// TTYProbeChild is the probe's child (see ProbeTTYSignals); its exit code
// is the answer.
func TTYProbeChild() int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT)
	fmt.Println("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return 1
	}
	if strings.ContainsRune(line, 0x03) {
		return ttyProbeByte
	}
	select {
	case <-sigs:
		return ttyProbeSignalled
	case <-time.After(5 * time.Second):
		return 1
	}
}
