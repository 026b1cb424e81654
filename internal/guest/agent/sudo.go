package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// sudo without setuid. gVisor honours no setuid bit (google/gvisor#5299),
// so an image's /usr/bin/sudo cannot raise a user's privileges there, and
// programs written for E2B call `sudo` as its user. On gVisor the runtime
// mounts the agent binary over /usr/bin/sudo (when the image has one):
// run as sudo (SudoMain) it asks the agent, PID 1 and root, over
// SudoSocket to run the command for it (ServeSudo). The agent grants what
// the image's sudoers grant without a password to everything — "NAME
// ALL=(ALL) NOPASSWD: ALL", or "%GROUP ..." — and nothing else: the base
// template's user has that rule, as E2B's has. This gives the code in a
// sandbox nothing it lacks (an exec may run as root already, and root in
// a sandbox is the sandbox's own); what it replaces is only the setuid
// step.

// SudoSocket is where the agent serves sudo inside the sandbox.
const SudoSocket = "/run/sandboxd/sudo.sock"

// securePath is the PATH of a command sudo runs (Debian's secure_path).
const securePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxSudoRequest bounds a request line (argv and environment).
const maxSudoRequest = 1 << 20

// sudoRequest is what the client sends: the command, as whom, where, with
// which environment, and its standard streams as SCM_RIGHTS.
type sudoRequest struct {
	Argv []string `json:"argv"`
	// User is the target ("" is root).
	User string   `json:"user,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	Env  []string `json:"env,omitempty"`
	// PreserveEnv keeps Env (-E); otherwise the command gets sudo's
	// reset environment.
	PreserveEnv bool `json:"preserve_env,omitempty"`
	// Login runs the target's login shell (-i), Shell a shell (-s):
	// with Argv as its command when there is one.
	Login bool `json:"login,omitempty"`
	Shell bool `json:"shell,omitempty"`
}

// sudoMessage goes both ways after the request: the client's signals to
// pass on, the server's end of the command (or why it did not run).
type sudoMessage struct {
	Signal int    `json:"signal,omitempty"`
	Exit   *int   `json:"exit,omitempty"`
	Error  string `json:"error,omitempty"`
}

// ServeSudo serves sudo on socket (SudoSocket) until ctx ends, with the
// passwd, group and sudoers files of Options.UserDB. The commands are the
// agent's children like its other processes: its reaper collects them
// (PID 1 reaps every child), so they are started and waited for through
// its process table, in the sandbox's cgroup.
func (a *Agent) ServeSudo(ctx context.Context, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return err
	}
	_ = os.Remove(socket)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("sudo: %w", err)
	}
	// Anyone may ask; the peer's uid decides.
	if err := os.Chmod(socket, 0o666); err != nil {
		l.Close()
		return fmt.Errorf("sudo: %w", err)
	}
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sudo: %w", err)
		}
		go a.serveSudo(c)
	}
}

// serveSudo runs one client's command.
func (a *Agent) serveSudo(c *net.UnixConn) {
	etc, log := a.opts.UserDB, a.log.With("component", "sudo")
	defer c.Close()
	enc := json.NewEncoder(c)
	fail := func(format string, args ...any) {
		_ = enc.Encode(sudoMessage{Error: fmt.Sprintf(format, args...)})
	}
	peer, err := peerUID(c)
	if err != nil {
		fail("who is asking: %v", err)
		return
	}
	req, files, rest, err := readSudoRequest(c)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		fail("%v", err)
		return
	}
	caller, err := userByUID(etc, peer)
	if err != nil {
		fail("you do not exist in the passwd database (uid %d)", peer)
		return
	}
	if peer != 0 && !sudoGranted(etc, caller) {
		log.Warn("sudo refused", "user", caller.name, "argv", req.Argv)
		fail("%s is not allowed to run sudo in this sandbox: only a user its sudoers grant ALL without a password may (sandboxd's sudo)", caller.name)
		return
	}
	target := "root"
	if req.User != "" {
		target = req.User
	}
	if !validUserName(target) {
		fail("unknown user %s", target)
		return
	}
	to, err := lookupUser(etc, target)
	if err != nil {
		fail("unknown user %s", target)
		return
	}
	cmd, err := sudoCommand(req, caller, to, files)
	if err != nil {
		fail("%v", err)
		return
	}
	a.placeInCgroup(cmd)
	wait, err := a.procs.start(cmd, cmd.Start)
	if err != nil {
		fail("%s: %v", req.Argv[0], err)
		return
	}
	// The command has its copies of the streams.
	for _, f := range files {
		f.Close()
	}
	files = nil
	pid := cmd.Process.Pid
	log.Info("sudo", "user", caller.name, "as", to.name, "argv", cmd.Args, "pid", pid)
	// The client's signals go to the command; the client gone (killed,
	// its terminal closed), the command's group ends with it.
	done := make(chan struct{})
	go func() {
		dec := json.NewDecoder(io.MultiReader(bytes.NewReader(rest), c))
		for {
			var m sudoMessage
			if err := dec.Decode(&m); err != nil {
				select {
				case <-done:
				default:
					_ = syscall.Kill(-pid, syscall.SIGKILL)
				}
				return
			}
			if m.Signal > 0 && m.Signal < 65 {
				_ = syscall.Kill(-pid, syscall.Signal(m.Signal))
			}
		}
	}()
	ws := <-wait
	close(done)
	code := ws.ExitStatus()
	if ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	_ = enc.Encode(sudoMessage{Exit: &code})
}

// sudoCommand is the command req asks for, as to, on the client's streams.
func sudoCommand(req sudoRequest, caller, to *account, files []*os.File) (*exec.Cmd, error) {
	argv := req.Argv
	if req.Login || req.Shell {
		sh := "/bin/sh"
		if _, err := os.Stat("/bin/bash"); err == nil {
			sh = "/bin/bash"
		}
		shArgv := []string{sh}
		if req.Login {
			shArgv = append(shArgv, "-l")
		}
		if len(argv) > 0 {
			shArgv = append(shArgv, "-c", strings.Join(argv, " "))
		}
		argv = shArgv
	}
	if len(argv) == 0 {
		return nil, errors.New("no command")
	}
	env := sudoEnv(req, caller, to)
	cwd := req.Cwd
	if req.Login || cwd == "" {
		cwd = to.home
	}
	path, err := lookPath(argv[0], envValue(env, "PATH"), cwd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", argv[0], err)
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: cwd,
		Stdin: files[0], Stdout: files[1], Stderr: files[2],
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Credential: to.credential()}}
	return cmd, nil
}

// sudoEnv is the command's environment: the client's with -E, else
// sudo's reset one (its terminal, the target's home and names, the
// secure PATH); with SUDO_USER, SUDO_UID, SUDO_GID and SUDO_COMMAND.
func sudoEnv(req sudoRequest, caller, to *account) []string {
	var env []string
	if req.PreserveEnv {
		for _, kv := range req.Env {
			if !strings.HasPrefix(kv, "SUDO_") {
				env = append(env, kv)
			}
		}
	} else {
		for _, k := range []string{"TERM", "COLORTERM", "LANG", "LC_ALL", "DISPLAY"} {
			if v := envValue(req.Env, k); v != "" {
				env = append(env, k+"="+v)
			}
		}
		env = append(env, "PATH="+securePath, "HOME="+to.home, "USER="+to.name, "LOGNAME="+to.name, "MAIL=/var/mail/"+to.name)
	}
	return append(env, "SUDO_USER="+caller.name, "SUDO_UID="+strconv.FormatUint(uint64(caller.uid), 10),
		"SUDO_GID="+strconv.FormatUint(uint64(caller.gid), 10), "SUDO_COMMAND="+strings.Join(req.Argv, " "))
}

// peerUID is the uid of the process at the other end of c.
func peerUID(c *net.UnixConn) (uint32, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, cerr
	}
	return cred.Uid, nil
}

// readSudoRequest reads the request line and the three streams passed
// with it.
func readSudoRequest(c *net.UnixConn) (req sudoRequest, files []*os.File, rest []byte, err error) {
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return req, nil, nil, fmt.Errorf("read the request: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err == nil {
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				files = append(files, os.NewFile(uintptr(fd), "sudo-stream"))
			}
		}
	}
	if len(files) != 3 {
		return req, files, nil, fmt.Errorf("the request came with %d streams, not 3", len(files))
	}
	// A stream socket may split the line: the rest follows, to its end.
	data := buf[:n]
	for !bytes.Contains(data, []byte("\n")) {
		if len(data) >= maxSudoRequest {
			return req, files, nil, fmt.Errorf("a request of more than %d bytes", maxSudoRequest)
		}
		more := make([]byte, min(64<<10, maxSudoRequest-len(data)))
		m, err := c.Read(more)
		if err != nil {
			return req, files, nil, fmt.Errorf("read the request: %w", err)
		}
		data = append(data, more[:m]...)
	}
	line, rest, _ := bytes.Cut(data, []byte("\n"))
	if err := json.Unmarshal(line, &req); err != nil {
		return req, files, nil, fmt.Errorf("a request that does not parse: %w", err)
	}
	if len(req.Argv) == 0 && !req.Login && !req.Shell {
		return req, files, nil, errors.New("no command")
	}
	return req, files, rest, nil
}

// userByUID is the passwd entry of uid.
func userByUID(etc string, uid uint32) (*account, error) {
	name := ""
	_ = scanDB(filepath.Join(etc, "passwd"), func(f []string) bool {
		if len(f) == 7 && f[2] == strconv.FormatUint(uint64(uid), 10) {
			name = f[0]
			return true
		}
		return false
	})
	if name == "" {
		return nil, fs.ErrNotExist
	}
	return lookupUser(etc, name)
}

// sudoGranted says whether the image's sudoers (/etc/sudoers and the
// files of /etc/sudoers.d) grant u everything without a password: a rule
// "u ALL=(ALL) NOPASSWD: ALL", "u ALL=(ALL:ALL) NOPASSWD: ALL", or one of
// those for "%group" of a group u is in. Nothing else is read as a grant.
func sudoGranted(etc string, u *account) bool {
	files := []string{filepath.Join(etc, "sudoers")}
	if ents, err := os.ReadDir(filepath.Join(etc, "sudoers.d")); err == nil {
		for _, e := range ents {
			// sudo skips names with a '.' or ending in '~'.
			if n := e.Name(); !strings.Contains(n, ".") && !strings.HasSuffix(n, "~") && e.Type().IsRegular() {
				files = append(files, filepath.Join(etc, "sudoers.d", n))
			}
		}
	}
	groups := groupNames(etc, u)
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			who, ok := grantAll(sc.Text())
			if !ok {
				continue
			}
			if who == u.name || strings.HasPrefix(who, "%") && slices.Contains(groups, who[1:]) {
				fh.Close()
				return true
			}
		}
		fh.Close()
	}
	return false
}

// grantAll reads line as a rule granting its subject everything without a
// password, and answers the subject.
func grantAll(line string) (string, bool) {
	f := strings.Fields(line)
	if len(f) < 3 || strings.HasPrefix(f[0], "#") {
		return "", false
	}
	rest := strings.Join(f[1:], " ")
	for _, want := range []string{"ALL=(ALL) NOPASSWD: ALL", "ALL=(ALL:ALL) NOPASSWD: ALL", "ALL=(ALL) NOPASSWD:ALL", "ALL=(ALL:ALL) NOPASSWD:ALL"} {
		if rest == want {
			return f[0], true
		}
	}
	return "", false
}

// groupNames are the names of u's groups.
func groupNames(etc string, u *account) []string {
	var out []string
	_ = scanDB(filepath.Join(etc, "group"), func(f []string) bool {
		if len(f) == 4 {
			if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && slices.Contains(u.groups, uint32(gid)) {
				out = append(out, f[0])
			}
		}
		return false
	})
	return out
}
