package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestConnectInTmux drives `sandboxd sandbox connect` on a real terminal
// (a tmux pane): the shell in the sandbox sees a terminal of the pane's
// size, runs what is typed, follows a resize, and the CLI exits with the
// shell's exit code. Without a terminal, input is piped through (and a
// terminal is made only with --tty), signals reach the command, and the
// refusals of POST .../exec come before the upgrade.
func TestConnectInTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		if os.Getenv("SANDBOXD_REQUIRE_RUNTIME") != "1" {
			t.Skip("tmux is not installed (scripts/install-deps.sh installs it)")
		}
		t.Fatal("tmux is not installed (scripts/install-deps.sh installs it; SANDBOXD_REQUIRE_RUNTIME=1)")
	}
	s := startServer(t, "")
	k := s.createKey(s.createAccount("connect", false).ID)
	sb := s.createSandbox(k, map[string]any{})
	id := sb["sandboxId"].(string)

	dir := t.TempDir()
	rc := filepath.Join(dir, "rc")
	sock := filepath.Join(dir, "tmux.sock")
	tmux := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("tmux", append([]string{"-S", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	script := binary + " sandbox connect --url " + s.base + " --key " + k.Key + " " + id + "; echo rc=$? > " + rc + "; sleep 60"
	tmux("new-session", "-d", "-s", "t", "-x", "120", "-y", "40", "sh", "-c", script)
	t.Cleanup(func() { _ = exec.Command("tmux", "-S", sock, "kill-server").Run() })
	screen := func() string { return tmux("capture-pane", "-p", "-t", "t") }
	waitScreen := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(screen(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("%q never appeared on the terminal:\n%s", want, screen())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// The shell's prompt may take a moment; typed input waits in the pty.
	tmux("send-keys", "-t", "t", "stty size; echo hello-$((6*7))", "Enter")
	waitScreen("hello-42")
	waitScreen("40 120")
	tmux("resize-window", "-t", "t", "-x", "100", "-y", "30")
	// The new size travels on its own (SIGWINCH to the CLI, a message on
	// the websocket, the agent's ioctl) and may arrive after a command
	// typed at once, on a loaded machine: ask again until it has.
	deadline := time.Now().Add(30 * time.Second)
	for {
		tmux("send-keys", "-t", "t", "clear; stty size", "Enter")
		if waitFor(2*time.Second, func() bool { return strings.Contains(screen(), "30 100") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q never appeared on the terminal:\n%s", "30 100", screen())
		}
	}
	tmux("send-keys", "-t", "t", "exit 3", "Enter")
	deadline = time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(rc)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			if got := strings.TrimSpace(string(b)); got != "rc=3" {
				t.Fatalf("the CLI exited with %s, want rc=3; terminal:\n%s", got, screen())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CLI did not exit; terminal:\n%s", screen())
		}
		time.Sleep(100 * time.Millisecond)
	}

	// connect runs the CLI with stdin (not a terminal) and returns its
	// output and exit code.
	connect := func(stdin string, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, binary, append([]string{"sandbox", "connect", "--url", s.base, "--key", k.Key}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("connect %s: %v", strings.Join(args, " "), err)
		}
		return string(out), cmd.ProcessState.ExitCode()
	}
	// Without a terminal: the default shell reads the piped input, no pty.
	if out, code := connect("test -t 0 || echo no-tty; echo piped-$((2+3)); exit 4\n", id); code != 4 || !strings.Contains(out, "no-tty\npiped-5\n") {
		t.Fatalf("piped connect: exit %d:\n%s", code, out)
	}
	// --shell, and --tty for a terminal of the default size.
	if out, code := connect("stty size; exit 0\n", "--tty", "--shell", "/bin/sh", id); code != 0 || !strings.Contains(out, "24 80") {
		t.Fatalf("connect --tty --shell /bin/sh: exit %d:\n%s", code, out)
	}
	if out, code := connect("", "--shell", "/bin/sh", id, "--", "true"); code != 1 || !strings.Contains(out, "not both") {
		t.Fatalf("connect --shell with a command: exit %d:\n%s", code, out)
	}

	// A signal to the CLI reaches the command, whose exit code it returns.
	cmd := exec.Command(binary, "sandbox", "connect", "--url", s.base, "--key", k.Key, id, "--",
		"sh", "-c", `trap 'echo got-int; exit 5' INT; echo ready; while :; do sleep 1; done`)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("connect printed %q before ready; stderr %s", lines.Text(), stderr.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	var rest strings.Builder
	for lines.Scan() {
		rest.WriteString(lines.Text() + "\n")
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 5 || rest.String() != "got-int\n" {
		t.Fatalf("after SIGINT: exit %d, stdout %q, stderr %s", code, rest.String(), stderr.String())
	}

	// A terminal through the JSON exec too: one stream, the size asked.
	r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{
		"command": "sh", "args": []string{"-c", "test -t 1 && echo tty; stty size; echo err >&2"}, "pty": map[string]any{"rows": 30, "cols": 90},
	})
	if r.Status != 200 || r.Body["stdout"] != "tty\r\n30 90\r\nerr\r\n" || r.Body["stderr"] != "" {
		t.Fatalf("exec with a pty: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "pty": map[string]any{"rows": 0, "cols": 90}}); r.Status != 400 || r.Body["error"] != "pty.rows must be between 1 and 1000" {
		t.Fatalf("exec with a 0-row pty: %d %s", r.Status, r.Raw)
	}
	// Another account's sandbox is refused before the upgrade, as 404.
	other := s.createKey(s.createAccount("connect-other", false).ID)
	out, err := exec.Command(binary, "sandbox", "connect", "--url", s.base, "--key", other.Key, id, "--", "true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "HTTP 404") {
		t.Fatalf("connect to another account's sandbox: %v %s", err, out)
	}
	t.Run("sandbox key", func(t *testing.T) {
		securitytest.Attack(t, "keys", "code in a sandbox opens the exec websocket (GET /api/sandboxes/{id}/exec) with its RECOUP_API_KEY, through `sandboxd sandbox connect`, to run commands that POST .../exec refuses it",
			"403 before the upgrade, saying the key is a sandbox's; nothing runs")
		out, err := exec.Command(binary, "sandbox", "connect", "--url", s.base, "--key", s.sandboxKey(k, id), id, "--", "touch", "/tmp/ran").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "HTTP 403") || !strings.Contains(string(out), "belongs to a sandbox") {
			t.Fatalf("connect with the sandbox's key: %v %s", err, out)
		}
		if r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "test", "args": []string{"-e", "/tmp/ran"}}); r.Status != 200 || r.Body["exitCode"] != 1.0 {
			t.Fatalf("the command ran: %d %s", r.Status, r.Raw)
		}
	})
	s.stopAll(k)
}

// waitFor reports whether cond held within d, checking every 100 ms.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}
