package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestConnectInTmux drives `sandboxd sandbox connect` on a real terminal
// (a tmux pane): the shell in the sandbox sees a terminal of the pane's
// size, runs what is typed, follows a resize, and the CLI exits with the
// shell's exit code.
func TestConnectInTmux(t *testing.T) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed (scripts/install-deps.sh installs it)")
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
	tmux("send-keys", "-t", "t", "clear; stty size", "Enter")
	waitScreen("30 100")
	tmux("send-keys", "-t", "t", "exit 3", "Enter")
	deadline := time.Now().Add(30 * time.Second)
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

	// A terminal through the JSON exec too: one stream, the size asked.
	r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{
		"command": "sh", "args": []string{"-c", "test -t 1 && echo tty; stty size"}, "pty": map[string]any{"rows": 30, "cols": 90},
	})
	if r.Status != 200 || r.Body["stdout"] != "tty\r\n30 90\r\n" {
		t.Fatalf("exec with a pty: %d %s", r.Status, r.Raw)
	}
	// Another account's sandbox is refused before the upgrade, as 404.
	other := s.createKey(s.createAccount("connect-other", false).ID)
	out, err := exec.Command(binary, "sandbox", "connect", "--url", s.base, "--key", other.Key, id, "--", "true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "HTTP 404") {
		t.Fatalf("connect to another account's sandbox: %v %s", err, out)
	}
	s.stopAll(k)
}
