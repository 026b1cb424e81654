package e2e

import (
	"path/filepath"
	"testing"
)

// TestExecOOM: a command that eats past the sandbox's memory limit is
// killed, the exec says so (oomKilled, exit 137), and the sandbox goes on.
func TestExecOOM(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "oom.db"), "--sandbox-memory-mib=128")
	a := s.createAccount("hog", false)
	k := s.createKey(a.ID)
	id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	exec := "/api/sandboxes/" + id + "/exec"
	// busybox tail keeps a line until its newline: /dev/zero has none.
	r := s.as(k, "POST", exec, map[string]any{"command": "tail", "args": []string{"/dev/zero"}})
	if r.Status != 200 || r.Body["oomKilled"] != true || r.Body["exitCode"] != 137.0 {
		t.Fatalf("memory hog: %d %s; want exit 137 and oomKilled", r.Status, r.Raw)
	}
	r = s.as(k, "POST", exec, map[string]any{"command": "echo", "args": []string{"alive"}})
	if r.Status != 200 || r.Body["stdout"] != "alive\n" || r.Body["oomKilled"] != nil {
		t.Fatalf("after the kill: %d %s", r.Status, r.Raw)
	}
}
