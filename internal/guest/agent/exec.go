package agent

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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
	// byPID and byTag hold the processes the agent started (the leaders of
	// their sessions): running ones, and ended ones for a while (ended,
	// oldest first) so a caller that comes back can still collect them.
	byPID map[int]*process
	byTag map[string]*process
	ended []*process
}

func newProcTable(reap bool) *procTable {
	return &procTable{reap: reap, waiters: map[int]chan syscall.WaitStatus{}, byPID: map[int]*process{}, byTag: map[string]*process{}}
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

// Ended processes are kept for Connect: at most keepEnded of them, none
// longer than endedFor. Their tails live in the sandbox's memory (up to
// two streams of Options.TailBytes each), so few.
const (
	keepEnded = 16
	endedFor  = 15 * time.Minute
)

// claimTag reserves tag for a process about to start; a tag of a running
// process cannot be taken. An ended process's tag goes to the new one.
func (t *procTable) claimTag(tag string) bool {
	if tag == "" {
		return true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.byTag[tag]; p != nil && p.running() {
		return false
	}
	t.byTag[tag] = nil // reserved
	return true
}

func (t *procTable) releaseTag(tag string) {
	if tag == "" {
		return
	}
	t.mu.Lock()
	if t.byTag[tag] == nil {
		delete(t.byTag, tag)
	}
	t.mu.Unlock()
}

func (t *procTable) add(p *process) {
	t.mu.Lock()
	t.byPID[p.pid] = p
	if p.tag != "" {
		t.byTag[p.tag] = p
	}
	t.mu.Unlock()
}

// finished moves p to the ended processes and forgets the oldest ones.
func (t *procTable) finished(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = append(t.ended, p)
	for len(t.ended) > 0 && (len(t.ended) > keepEnded || time.Since(t.ended[0].endedAt()) > endedFor) {
		old := t.ended[0]
		t.ended = t.ended[1:]
		if t.byPID[old.pid] == old {
			delete(t.byPID, old.pid)
		}
		if old.tag != "" && t.byTag[old.tag] == old {
			delete(t.byTag, old.tag)
		}
	}
}

// lookup finds a process by pid or tag.
func (t *procTable) lookup(pid int, tag string) *process {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tag != "" {
		return t.byTag[tag]
	}
	return t.byPID[pid]
}

// running lists the processes that still run, oldest first.
func (t *procTable) running() []*process {
	t.mu.Lock()
	out := make([]*process, 0, len(t.byPID))
	for _, p := range t.byPID {
		if p.running() {
			out = append(out, p)
		}
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b *process) int { return a.started.Compare(b.started) })
	return out
}

// killSession sends sig to every process of session sid: its process group
// first (cheap, covers the common case), then any process that moved to
// another group of the same session.
func killSession(sid int, sig syscall.Signal) {
	_ = syscall.Kill(-sid, sig)
	for _, p := range listProcs() {
		// Those in the group have it already: a second one would run a
		// trap twice.
		if p.sid == sid && p.pgrp != sid {
			_ = syscall.Kill(p.pid, sig)
		}
	}
}

type procInfo struct {
	pid, pgrp, sid int
	name           string
	rss            int64 // bytes
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
		pgrp, _ := strconv.Atoi(f[2])
		sid, _ := strconv.Atoi(f[3])
		p := procInfo{pid: pid, pgrp: pgrp, sid: sid, name: s[open+1 : end]}
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
func (t *procTable) oomKill() guest.Killed {
	self := os.Getpid()
	ours := map[int]*process{}
	for _, p := range t.running() {
		ours[p.pid] = p
	}
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
		return guest.Killed{}
	}
	if p := ours[victim.sid]; p != nil {
		p.mu.Lock()
		p.oomKilled = true
		p.mu.Unlock()
	}
	_ = syscall.Kill(victim.pid, syscall.SIGKILL)
	return guest.Killed{PID: victim.pid, Name: victim.name, RSS: victim.rss}
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
// the session's own group sid (gVisor's master does not answer TIOCGPGRP),
// or, for a process under a tty-session helper, the group the helper
// finds (see ttysignals.go).
func setWinsize(f *os.File, rows, cols uint16, sid int, helper *ttySignaller) {
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
		if helper != nil {
			helper.send(unix.SIGWINCH)
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
