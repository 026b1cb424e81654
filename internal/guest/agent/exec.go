package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/guest"
)

// outputGrace is how long output is still collected after a process exits:
// a background child that inherited stdout must not hold the request open
// forever, but the last writes of the process itself must not be lost.
const outputGrace = 200 * time.Millisecond

// procTable tracks the sessions the agent started and, in reap mode, is the
// only waiter for children.
type procTable struct {
	reap bool
	// startMu: starts hold it shared, the reaper exclusively, so a child that
	// exits before it is registered is still delivered to its waiter.
	startMu sync.RWMutex
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	running map[int]*proc // by session id (= pid of the started process)
}

type proc struct {
	mu        sync.Mutex
	oomKilled bool
	timedOut  bool
}

func newProcTable(reap bool) *procTable {
	return &procTable{reap: reap, waiters: map[int]chan syscall.WaitStatus{}, running: map[int]*proc{}}
}

// reapLoop reaps every child of the agent; statuses of processes the agent
// started go to their waiters, orphans are just collected.
func (t *procTable) reapLoop() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, syscall.SIGCHLD)
	tick := time.NewTicker(time.Second) // a safety net for coalesced signals
	defer tick.Stop()
	for {
		select {
		case <-ch:
		case <-tick.C:
		}
		t.startMu.Lock()
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			t.mu.Lock()
			w := t.waiters[pid]
			delete(t.waiters, pid)
			t.mu.Unlock()
			if w != nil {
				w <- ws
			}
		}
		t.startMu.Unlock()
	}
}

// start starts cmd via startFn and returns a channel that delivers its wait
// status exactly once.
func (t *procTable) start(cmd *exec.Cmd, startFn func() error) (<-chan syscall.WaitStatus, error) {
	t.startMu.RLock()
	if err := startFn(); err != nil {
		t.startMu.RUnlock()
		return nil, err
	}
	pid := cmd.Process.Pid
	w := make(chan syscall.WaitStatus, 1)
	if t.reap {
		t.mu.Lock()
		t.waiters[pid] = w
		t.mu.Unlock()
		t.startMu.RUnlock()
		return w, nil
	}
	t.startMu.RUnlock()
	go func() {
		st, err := cmd.Process.Wait()
		if err != nil {
			w <- syscall.WaitStatus(0xff << 8)
			return
		}
		w <- st.Sys().(syscall.WaitStatus)
	}()
	return w, nil
}

func (t *procTable) add(sid int) *proc {
	p := &proc{}
	t.mu.Lock()
	t.running[sid] = p
	t.mu.Unlock()
	return p
}

func (t *procTable) remove(sid int) {
	t.mu.Lock()
	delete(t.running, sid)
	t.mu.Unlock()
}

// killSession sends sig to every process of session sid: its process group
// first (cheap, covers the common case), then any process that moved to
// another group of the same session.
func killSession(sid int, sig syscall.Signal) {
	_ = syscall.Kill(-sid, sig)
	for _, p := range listProcs() {
		if p.sid == sid {
			_ = syscall.Kill(p.pid, sig)
		}
	}
}

type procInfo struct {
	pid, sid int
	name     string
	rss      int64 // bytes
}

// listProcs reads /proc: pid, session, name and resident memory.
func listProcs() []procInfo {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	page := int64(os.Getpagesize())
	var out []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The name is in parentheses and may contain spaces; fields follow
		// the last ')': state ppid pgrp session ...
		s := string(stat)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) < 4 {
			continue
		}
		sid, _ := strconv.Atoi(f[3])
		p := procInfo{pid: pid, sid: sid, name: s[open+1 : end]}
		if statm, err := os.ReadFile("/proc/" + e.Name() + "/statm"); err == nil {
			if sf := strings.Fields(string(statm)); len(sf) >= 2 {
				n, _ := strconv.ParseInt(sf[1], 10, 64)
				p.rss = n * page
			}
		}
		out = append(out, p)
	}
	return out
}

// oomKill kills the process with the largest resident set among those the
// agent may kill: in reap (PID 1) mode every process but itself, otherwise
// only processes in sessions it started.
func (t *procTable) oomKill() *guest.Killed {
	self := os.Getpid()
	t.mu.Lock()
	ours := make(map[int]*proc, len(t.running))
	for sid, p := range t.running {
		ours[sid] = p
	}
	t.mu.Unlock()
	var victim *procInfo
	for _, p := range listProcs() {
		if p.pid == self || p.pid == 1 {
			continue
		}
		if !t.reap && ours[p.sid] == nil {
			continue
		}
		if victim == nil || p.rss > victim.rss {
			v := p
			victim = &v
		}
	}
	if victim == nil {
		return nil
	}
	if p := ours[victim.sid]; p != nil {
		p.mu.Lock()
		p.oomKilled = true
		p.mu.Unlock()
	}
	_ = syscall.Kill(victim.pid, syscall.SIGKILL)
	return &guest.Killed{PID: victim.pid, Name: victim.name, RSS: victim.rss}
}

// mergeEnv appends extra to base; a later NAME=value replaces an earlier one
// in place, so the result has one entry per name.
func mergeEnv(base []string, extra ...[]string) []string {
	out := append([]string(nil), base...)
	idx := map[string]int{}
	for i, kv := range out {
		k, _, _ := strings.Cut(kv, "=")
		idx[k] = i
	}
	for _, list := range extra {
		for _, kv := range list {
			k, _, _ := strings.Cut(kv, "=")
			if i, ok := idx[k]; ok {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

func envValue(env []string, name string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}

// errNotFound and errNotExecutable classify lookPath failures the way a
// shell does (exit codes 127 and 126).
var (
	errNotFound      = errors.New("command not found")
	errNotExecutable = errors.New("permission denied")
)

// lookPath resolves file against the PATH of the process's environment (not
// the agent's own), relative to dir for names containing a slash.
func lookPath(file, pathEnv, dir string) (string, error) {
	check := func(p string) error {
		fi, err := os.Stat(p)
		if err != nil {
			return errNotFound
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return errNotExecutable
		}
		return nil
	}
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		return p, check(p)
	}
	firstErr := errNotFound
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		err := check(p)
		if err == nil {
			return p, nil
		}
		if errors.Is(err, errNotExecutable) {
			firstErr = err
		}
	}
	return "", firstErr
}

// exec runs one process for an exec stream.
func (a *Agent) exec(st *yamux.Stream, w *frameWriter, spec guest.ExecSpec) {
	env := mergeEnv(a.opts.Env, spec.Env)
	if spec.TTY && envValue(env, "TERM") == "" {
		env = append(env, "TERM=xterm-256color")
	}
	dir := spec.Cwd
	if dir == "" {
		dir = a.opts.Cwd
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		msg := fmt.Sprintf("working directory %s: not a directory", dir)
		if err != nil {
			msg = fmt.Sprintf("working directory %s: %v", dir, errors.Unwrap(err))
		}
		_ = w.json(guest.FrameExit, guest.Exit{Code: -1, Error: msg})
		return
	}
	path, err := lookPath(spec.Cmd[0], envValue(env, "PATH"), dir)
	if err != nil {
		code := 127
		if errors.Is(err, errNotExecutable) {
			code = 126
		}
		_ = w.frame(guest.FrameStderr, []byte(fmt.Sprintf("sandbox-agent: %s: %v\n", spec.Cmd[0], err)))
		_ = w.json(guest.FrameExit, guest.Exit{Code: code, NotFound: code == 127})
		return
	}
	cmd := &exec.Cmd{Path: path, Args: spec.Cmd, Env: env, Dir: dir}

	var (
		stdinW  io.WriteCloser // where host stdin goes
		readers []*os.File     // output sources: (stdout, stderr) or the pty
		toClose []*os.File     // child ends to close after start
		ptyFile *os.File
	)
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	startFn := cmd.Start
	if spec.TTY {
		rows, cols := spec.Rows, spec.Cols
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		startFn = func() error {
			f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: rows, Cols: cols})
			ptyFile = f
			return err
		}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		outR, outW, err := os.Pipe()
		if err != nil {
			_ = w.json(guest.FrameExit, guest.Exit{Code: -1, Error: err.Error()})
			return
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			closeAll([]*os.File{outR, outW})
			_ = w.json(guest.FrameExit, guest.Exit{Code: -1, Error: err.Error()})
			return
		}
		cmd.Stdout, cmd.Stderr = outW, errW
		readers = []*os.File{outR, errR}
		toClose = []*os.File{outW, errW}
		if spec.Stdin {
			inR, inW, err := os.Pipe()
			if err != nil {
				closeAll(append(readers, toClose...))
				_ = w.json(guest.FrameExit, guest.Exit{Code: -1, Error: err.Error()})
				return
			}
			cmd.Stdin = inR
			toClose = append(toClose, inR)
			stdinW = inW
		}
	}
	a.placeInCgroup(cmd)
	oomBefore, oomCounted := a.oomKills()
	wait, err := a.procs.start(cmd, startFn)
	closeAll(toClose)
	if err != nil {
		closeAll(readers)
		if stdinW != nil {
			stdinW.Close()
		}
		_ = w.json(guest.FrameExit, guest.Exit{Code: 126, Error: fmt.Sprintf("start %s: %v", spec.Cmd[0], err)})
		return
	}
	if spec.TTY {
		ptyFile = pollable(ptyFile)
		readers = []*os.File{ptyFile}
		if spec.Stdin {
			stdinW = ptyFile
		}
	}
	sid := cmd.Process.Pid
	p := a.procs.add(sid)
	defer a.procs.remove(sid)
	_ = w.json(guest.FrameStarted, guest.Started{PID: sid})

	// Output pumps: each chunk becomes a frame as soon as it is read.
	var outWG sync.WaitGroup
	for i, r := range readers {
		t := guest.FrameStdout
		if i == 1 {
			t = guest.FrameStderr
		}
		outWG.Add(1)
		go func(r *os.File, t guest.FrameType) {
			defer outWG.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					if w.frame(t, buf[:n]) != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}(r, t)
	}

	// Host frames: stdin, resize, signals. The stream ending before the
	// process means the host gave up: kill the session.
	hostGone := make(chan struct{})
	go func() {
		defer close(hostGone)
		for {
			t, payload, err := guest.ReadFrame(st)
			if err != nil {
				if stdinW != nil && stdinW != ptyFile {
					stdinW.Close()
				}
				return
			}
			switch t {
			case guest.FrameStdin:
				if stdinW != nil {
					_, _ = stdinW.Write(payload)
				}
			case guest.FrameStdinClose:
				if stdinW == ptyFile && ptyFile != nil {
					_, _ = ptyFile.Write([]byte{4}) // ^D: EOF for the terminal's reader
				} else if stdinW != nil {
					stdinW.Close()
				}
			case guest.FrameResize:
				var rz guest.Resize
				if json.Unmarshal(payload, &rz) == nil && ptyFile != nil {
					setWinsize(ptyFile, rz.Rows, rz.Cols, sid)
				}
			case guest.FrameSignal:
				var sg guest.Signal
				if json.Unmarshal(payload, &sg) == nil && sg.Signal > 0 {
					killSession(sid, syscall.Signal(sg.Signal))
				}
			}
		}
	}()

	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		t := time.NewTimer(time.Duration(spec.Timeout) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var ws syscall.WaitStatus
	for done := false; !done; {
		select {
		case ws = <-wait:
			done = true
		case <-timeout:
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			killSession(sid, syscall.SIGKILL)
			timeout = nil
		case <-hostGone:
			killSession(sid, syscall.SIGKILL)
			hostGone = nil
		}
	}
	// The leader is gone; a timed out or cancelled session loses the rest of
	// its processes too, so nothing it started keeps running unobserved.
	p.mu.Lock()
	timedOut, oom := p.timedOut, p.oomKilled
	p.mu.Unlock()
	if timedOut || hostGone == nil {
		killSession(sid, syscall.SIGKILL)
	}
	outDone := make(chan struct{})
	go func() { outWG.Wait(); close(outDone) }()
	select {
	case <-outDone:
	case <-time.After(outputGrace):
		for _, r := range readers {
			_ = r.SetReadDeadline(time.Now())
		}
		select {
		case <-outDone:
		case <-time.After(outputGrace):
			// A reader the poller cannot interrupt (a terminal some
			// kernels cannot poll) stays blocked; seal the stream so its
			// late output never follows the exit frame.
			w.seal()
			a.log.Warn("output reader still blocked after exit", "pid", sid)
		}
	}
	closeAll(readers)
	if stdinW != nil && stdinW != ptyFile {
		stdinW.Close()
	}
	_ = cmd.Process.Release()
	if !oom && oomCounted && killedLike(ws) {
		// The kernel's OOM killer (a microVM's cgroup at its memory.max)
		// took this session's leader or one of its children while it ran.
		// Another session's kill in the same window would be counted
		// too; a cgroup per session would tell them apart.
		if after, ok := a.oomKills(); ok && after > oomBefore {
			oom = true
		}
	}
	exit := guest.Exit{Code: ws.ExitStatus(), TimedOut: timedOut, OOMKilled: oom}
	if ws.Signaled() {
		exit.Signal = int(ws.Signal())
		exit.Code = 128 + exit.Signal
	}
	_ = w.final(guest.FrameExit, exit)
}

// pollable returns f (a pty master) as a non-blocking file registered with
// Go's poller, so reads honour deadlines. creack/pty opens it blocking, and
// gVisor's terminal then never reports EOF once the child is gone: without
// a deadline the output reader would hang. If the fd cannot be made
// non-blocking f is returned as it was.
func pollable(f *os.File) *os.File {
	rc, err := f.SyscallConn()
	if err != nil {
		return f
	}
	nfd := -1
	_ = rc.Control(func(fd uintptr) {
		if d, err := unix.Dup(int(fd)); err == nil {
			nfd = d
		}
	})
	if nfd < 0 {
		return f
	}
	unix.CloseOnExec(nfd)
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return f
	}
	f.Close()
	return os.NewFile(uintptr(nfd), "ptmx")
}

// setWinsize resizes a terminal without os.File.Fd, which would put the
// file back into blocking mode, and tells the terminal's foreground
// process group with SIGWINCH when the size changed. Linux sends that
// signal itself; gVisor's pseudo-terminals only store the size, so a
// full-screen program there would never redraw. A second SIGWINCH on
// Linux is harmless: it only means "read your size again". The group is
// the terminal's foreground group where the master tells it (Linux), else
// the session's own group sid (gVisor's master does not answer TIOCGPGRP).
func setWinsize(f *os.File, rows, cols uint16, sid int) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		old, err := unix.IoctlGetWinsize(int(fd), unix.TIOCGWINSZ)
		if err == nil && old.Row == rows && old.Col == cols {
			return
		}
		if unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}) != nil {
			return
		}
		pgrp, err := unix.IoctlGetInt(int(fd), unix.TIOCGPGRP)
		if err != nil || pgrp <= 0 {
			pgrp = sid
		}
		if pgrp > 0 {
			_ = unix.Kill(-pgrp, unix.SIGWINCH)
		}
	})
}

// errIsDir is the error for reading a directory as a file.
var errIsDir = unix.EISDIR

// isNotFound says whether err means a missing file.
func isNotFound(err error) bool { return errors.Is(err, fs.ErrNotExist) }

// isDirErr says whether err means the path is a directory.
func isDirErr(err error) bool { return errors.Is(err, unix.EISDIR) }
