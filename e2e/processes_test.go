package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestProcesses lists the processes of a sandbox (a run's command, tagged
// with its run) and kills one by pid with everything it started: the run
// ends with the kill's exit code, the list empties, and neither another
// account nor an unknown pid reaches anything.
func TestProcesses(t *testing.T) {
	s := startServer(t, "")
	k := s.createKey(s.createAccount("procs", false).ID)
	other := s.createKey(s.createAccount("procs-other", false).ID)
	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", "sleep 300 & sleep 300 & wait"}})
	id, runID := sb["sandboxId"].(string), sb["runId"].(string)
	waitStatus(t, s, k, runID, "EXECUTING")

	var pid float64
	deadline := time.Now().Add(30 * time.Second)
	for pid == 0 {
		r := s.as(k, "GET", "/api/sandboxes/"+id+"/processes", nil)
		if r.Status != 200 {
			t.Fatalf("list processes: %d %s", r.Status, r.Raw)
		}
		for _, p := range r.Body["processes"].([]any) {
			p := p.(map[string]any)
			if p["tag"] == runID && p["command"].([]any)[0] == "sh" && p["startedAt"] != "" {
				pid = p["pid"].(float64)
			}
		}
		if pid == 0 && time.Now().After(deadline) {
			t.Fatalf("the run's command is not listed: %s", r.Raw)
		}
	}
	kill := fmt.Sprintf("/api/sandboxes/%s/processes/%d", id, int(pid))
	if r := s.as(other, "DELETE", kill, nil); r.Status != 404 {
		t.Fatalf("kill by another account: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "DELETE", kill+"?signal=SIGSTOPPED", nil); r.Status != 400 {
		t.Fatalf("kill with an unknown signal: %d %s", r.Status, r.Raw)
	}
	// The CLI lists and kills through the same routes.
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(binary, append([]string{"sandbox", "--url", s.base, "--key", k.Key}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("sandboxd sandbox %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	if out := cli("ps", id); !strings.HasPrefix(out, "PID ") || !strings.Contains(out, fmt.Sprintf("%d  ", int(pid))) || !strings.Contains(out, runID) {
		t.Fatalf("sandbox ps:\n%s", out)
	}
	if out := cli("kill", id, fmt.Sprint(int(pid))); out != fmt.Sprintf("killed process %d\n", int(pid)) {
		t.Fatalf("sandbox kill: %q", out)
	}
	if r := s.waitRun(k, runID, time.Minute); r.Status != "COMPLETED" || r.Output["exitCode"] != 137.0 {
		t.Fatalf("killed run: %s %v", r.Status, r.Output)
	}
	r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "pgrep sleep || echo none"}})
	if r.Status != 200 || r.Body["stdout"] != "none\n" {
		t.Fatalf("the killed command's children: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "GET", "/api/sandboxes/"+id+"/processes", nil); r.Status != 200 || len(r.Body["processes"].([]any)) != 0 {
		t.Fatalf("processes after the kill: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "DELETE", kill, nil); r.Status != 404 {
		t.Fatalf("kill of an ended process: %d %s", r.Status, r.Raw)
	}
	s.stopAll(k)
}
