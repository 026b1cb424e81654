package agent

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandboxd/sandboxd/internal/guest"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
)

// serveCode serves the code interpreter (guest.CodePath) as the request's
// user, with the host's variables and directory for new contexts.
func (a *Agent) serveCode(w http.ResponseWriter, r *http.Request) {
	u, err := a.requestUser(r.Header)
	if err != nil {
		status := http.StatusBadRequest
		if !errors.As(err, new(*badUserError)) {
			status = http.StatusInternalServerError
		}
		http.Error(w, err.Error(), status)
		return
	}
	var extra []string
	for _, kv := range r.Header.Values(guest.CodeEnvHeader) {
		if k, _, ok := strings.Cut(kv, "="); ok && k != "" {
			extra = append(extra, kv)
		}
	}
	c := codeint.Caller{User: "root", Env: mergeEnv(a.opts.Env, u.env(), extra), Dir: a.opts.Cwd}
	if u != nil {
		c.User = u.name
		if isDir(u.home) {
			c.Dir = u.home
		}
	}
	if d := r.Header.Get(guest.CodeDirHeader); filepath.IsAbs(d) && isDir(d) {
		c.Dir = d
	}
	a.code.ServeHTTP(w, r, c)
}

// launchShim starts the code interpreter's shim as c's user, in a session
// of its own (killed whole), in the sandbox's cgroup, reaped by the
// agent; its stderr (the kernels' own complaints) goes to the agent's log,
// a line at a time and bounded.
func (a *Agent) launchShim(c codeint.Caller, argv, env []string) (*codeint.Process, error) {
	var u *account
	if c.User != "root" {
		var err error
		if u, err = lookupUser(a.opts.UserDB, c.User); err != nil {
			return nil, err
		}
	}
	path, err := lookPath(argv[0], envValue(env, "PATH"), "/")
	if err != nil {
		return nil, errors.New("this sandbox has no python3: the code interpreter needs Python 3 with jupyter_client and ipykernel (the built-in code-interpreter template has them)")
	}
	cmd := &exec.Cmd{Path: path, Args: argv, Env: env, Dir: c.Dir, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if u != nil {
		cmd.SysProcAttr.Credential = u.credential()
	}
	// Pipes of our own, not cmd's: the process is reaped by the agent
	// (procTable), never by cmd.Wait, which would close cmd's.
	var ends []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	for range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			closeAll(ends)
			return nil, err
		}
		ends = append(ends, r, w)
	}
	inR, inW, outR, outW, errR, errW := ends[0], ends[1], ends[2], ends[3], ends[4], ends[5]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	a.placeInCgroup(cmd)
	wait, err := a.procs.start(cmd, cmd.Start)
	closeAll([]*os.File{inR, outW, errW})
	if err != nil {
		closeAll([]*os.File{inW, outR, errR})
		return nil, err
	}
	stderr := errR
	pid := cmd.Process.Pid
	go func() {
		sc := bufio.NewScanner(io.LimitReader(stderr, 1<<20))
		for sc.Scan() {
			a.log.Debug("code interpreter", "user", c.User, "line", sc.Text())
		}
		_, _ = io.Copy(io.Discard, stderr)
		stderr.Close()
	}()
	go func() {
		ws := <-wait
		a.log.Info("code interpreter exited", "user", c.User, "pid", pid, "status", ws)
	}()
	return &codeint.Process{Stdin: inW, Stdout: outR, Kill: func() { killSession(pid, syscall.SIGKILL) }}, nil
}
