package agent

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestParseSudoArgs: sudo's options as programs pass them; an option this
// sudo does not implement is an error naming it, never ignored.
func TestParseSudoArgs(t *testing.T) {
	for _, c := range []struct {
		args   []string
		argv   []string
		user   string
		env    bool
		login  bool
		errHas string
	}{
		{args: []string{"apt-get", "install", "-y", "jq"}, argv: []string{"apt-get", "install", "-y", "jq"}},
		{args: []string{"-n", "id", "-u"}, argv: []string{"id", "-u"}},
		{args: []string{"-nE", "--", "-weird"}, argv: []string{"-weird"}, env: true},
		{args: []string{"-u", "nobody", "id"}, argv: []string{"id"}, user: "nobody"},
		{args: []string{"-unobody", "id"}, argv: []string{"id"}, user: "nobody"},
		{args: []string{"--user=nobody", "id"}, argv: []string{"id"}, user: "nobody"},
		{args: []string{"-i"}, login: true},
		{args: []string{"-g", "adm", "id"}, errHas: "-g"},
		{args: []string{"--chroot=/x", "id"}, errHas: "--chroot=/x"},
		{args: []string{"-u"}, errHas: "requires an argument"},
	} {
		o, err := parseSudoArgs(c.args)
		if c.errHas != "" {
			if err == nil || !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("%q: %v, want an error naming %s", c.args, err, c.errHas)
			}
			continue
		}
		if err != nil || !slices.Equal(o.req.Argv, c.argv) || o.req.User != c.user || o.req.PreserveEnv != c.env || o.req.Login != c.login {
			t.Errorf("%q: %+v %v", c.args, o.req, err)
		}
	}
}

// sudoEtc writes a passwd, group and sudoers of a user who may (alice,
// by her own rule; carol, by her group's) and one who may not (bob).
func sudoEtc(t *testing.T) string {
	t.Helper()
	etc := t.TempDir()
	files := map[string]string{
		"passwd":        "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\nbob:x:1001:1001::/home/bob:/bin/sh\ncarol:x:1002:1002::/home/carol:/bin/sh\n",
		"group":         "root:x:0:\nalice:x:1000:\nbob:x:1001:\ncarol:x:1002:\nsudo:x:27:carol\n",
		"sudoers":       "# the main file\nroot ALL=(ALL:ALL) ALL\nbob ALL=(ALL) ALL\n%sudo ALL=(ALL:ALL) NOPASSWD: ALL\n",
		"sudoers.d/u":   "alice ALL=(ALL:ALL) NOPASSWD: ALL\n",
		"sudoers.d/b.x": "bob ALL=(ALL) NOPASSWD: ALL\n", // a name with a dot: sudo skips it
	}
	for name, content := range files {
		p := filepath.Join(etc, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return etc
}

// TestSudoGranted: only a rule granting everything without a password
// grants, by name or by group; a rule needing a password, a skipped file
// or a comment does not.
func TestSudoGranted(t *testing.T) {
	etc := sudoEtc(t)
	for name, want := range map[string]bool{"alice": true, "bob": false, "carol": true, "root": false} {
		u, err := lookupUser(etc, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := sudoGranted(etc, u); got != want {
			t.Errorf("%s: granted %v, want %v", name, got, want)
		}
	}
}

// TestSudoEnv: sudo's reset environment (the terminal kept, the target's
// home and names, the secure PATH, nothing else of the caller's), or the
// caller's with -E; SUDO_* either way, never the caller's own SUDO_*.
func TestSudoEnv(t *testing.T) {
	etc := sudoEtc(t)
	alice, _ := lookupUser(etc, "alice")
	root, _ := lookupUser(etc, "root")
	req := sudoRequest{Argv: []string{"id"}, Env: []string{"TERM=xterm", "SECRET=x", "PATH=/evil", "SUDO_USER=mallory"}}
	env := sudoEnv(req, alice, root)
	for _, want := range []string{"TERM=xterm", "PATH=" + securePath, "HOME=/root", "USER=root", "SUDO_USER=alice", "SUDO_UID=1000"} {
		if !slices.Contains(env, want) {
			t.Errorf("reset env %q lacks %s", env, want)
		}
	}
	if slices.Contains(env, "SECRET=x") || slices.Contains(env, "SUDO_USER=mallory") {
		t.Errorf("reset env kept the caller's: %q", env)
	}
	req.PreserveEnv = true
	env = sudoEnv(req, alice, root)
	if !slices.Contains(env, "SECRET=x") || slices.Contains(env, "SUDO_USER=mallory") || !slices.Contains(env, "SUDO_USER=alice") {
		t.Errorf("-E env %q", env)
	}
}

// serveSudoAt serves sudo for the files of etc on sock until the test
// ends, and waits for the socket.
func serveSudoAt(t *testing.T, etc, sock string) {
	t.Helper()
	a := New(Options{UserDB: etc, Reap: false})
	go func() { _ = a.ServeSudo(t.Context(), sock) }()
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(sock); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSudoRoundTrip: a client's command runs through the server on the
// client's streams and its exit status comes back; a command that is not
// there is the client's error. The test runs as root, whom the server
// lets through (a root caller needs no rule).
func TestSudoRoundTrip(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the server runs commands as other users: needs root")
	}
	etc := sudoEtc(t)
	sock := filepath.Join(t.TempDir(), "sudo.sock")
	serveSudoAt(t, etc, sock)
	run := func(req sudoRequest) (int, string, error) {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		stdin, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer stdin.Close()
		code, rerr := runSudo(sock, req, [3]int{int(stdin.Fd()), int(w.Fd()), int(w.Fd())})
		w.Close()
		out, _ := io.ReadAll(r)
		r.Close()
		return code, string(out), rerr
	}
	code, out, err := run(sudoRequest{Argv: []string{"sh", "-c", "echo $SUDO_USER $USER; pwd; exit 3"}, Cwd: "/"})
	if err != nil || code != 3 || out != "root root\n/\n" {
		t.Fatalf("round trip: %d %q %v", code, out, err)
	}
	// A request larger than one read of the socket (a big environment,
	// kept with -E) arrives whole.
	big := sudoRequest{Argv: []string{"sh", "-c", "echo ${#BIG}"}, Cwd: "/", PreserveEnv: true, Env: []string{"PATH=/usr/bin:/bin", "BIG=" + strings.Repeat("x", 100<<10), "BIG2=" + strings.Repeat("y", 100<<10), "BIG3=" + strings.Repeat("z", 100<<10)}}
	if code, out, err := run(big); err != nil || code != 0 || out != fmt.Sprintf("%d\n", 100<<10) {
		t.Fatalf("a big request: %d %q %v", code, out, err)
	}
	if _, _, err := run(sudoRequest{Argv: []string{"no-such-command-here"}}); err == nil || !strings.Contains(err.Error(), "command not found") {
		t.Fatalf("a missing command: %v", err)
	}
	if _, _, err := run(sudoRequest{Argv: []string{"id"}, User: "nobody-here"}); err == nil || !strings.Contains(err.Error(), "unknown user") {
		t.Fatalf("an unknown user: %v", err)
	}
}

// sudoHelperEnv names the socket a re-run of this test binary asks as an
// unprivileged user (TestSudoRefusesTheUngranted).
const sudoHelperEnv = "SANDBOXD_TEST_SUDO_SOCKET"

// TestSudoRefusesTheUngranted: a user the image's sudoers grant nothing
// without a password (bob) asks the agent's sudo to run a command as root
// from a process of his own uid: refused, naming him, and nothing runs.
func TestSudoRefusesTheUngranted(t *testing.T) {
	if sock := os.Getenv(sudoHelperEnv); sock != "" {
		// The re-run, as bob: ask, and print what the server said.
		_, err := runSudo(sock, sudoRequest{Argv: []string{"touch", os.Getenv(sudoHelperEnv + "_MARK")}, Cwd: "/"}, [3]int{0, 1, 2})
		fmt.Printf("answer: %v\n", err)
		return
	}
	if os.Getuid() != 0 {
		t.Skip("runs a process as another user: needs root")
	}
	securitytest.Attack(t, "sudo", "an unprivileged user in a gVisor sandbox asks the guest agent's sudo (which replaces setuid sudo there) to run a command as root without a sudoers grant",
		"refused: the agent reads the caller's uid from the socket (SO_PEERCRED), never from the request, and runs only for a user the image's sudoers grant ALL without a password")
	etc := sudoEtc(t)
	dir, err := os.MkdirTemp("", "sudo-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// bob reaches the socket and runs the copy of this binary.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "agent.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sudo.sock")
	serveSudoAt(t, etc, sock)
	mark := filepath.Join(dir, "ran-as-root")
	cmd := exec.Command(bin, "-test.run=^TestSudoRefusesTheUngranted$")
	cmd.Env = []string{sudoHelperEnv + "=" + sock, sudoHelperEnv + "_MARK=" + mark}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1001, Gid: 1001}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the re-run as bob: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "bob is not allowed to run sudo") {
		t.Fatalf("bob's sudo was not refused: %s", out)
	}
	if _, err := os.Stat(mark); err == nil {
		t.Fatal("bob's command ran")
	}
}
