package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// prewarmMetric reads one sample of the prewarm metrics from the metrics
// listener: sandboxd_prewarm_kept, or sandboxd_prewarm_total{event="..."}.
func (s *server) prewarmMetric(name string) float64 {
	s.t.Helper()
	resp, err := http.Get(s.metrics + "/metrics")
	if err != nil {
		s.t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				s.t.Fatalf("metric %s: %q", name, v)
			}
			return f
		}
	}
	s.t.Fatalf("no metric %s", name)
	return 0
}

// TestPrewarm: after a run, the account's next sandbox is started ahead
// from the new snapshot, and a create is handed it: with exactly the
// snapshot's files (in and outside the repository), the repository's
// current state (a push made after the start ahead), a sandbox key of its
// own, and nothing of it reaches another account's sandbox.
func TestPrewarm(t *testing.T) {
	s := imageServer(t, filepath.Join(t.TempDir(), "prewarm.db"))
	a, b := s.createAccount("prewarm-a", false), s.createAccount("prewarm-b", false)
	ka, kb := s.createKey(a.ID), s.createKey(b.ID)
	taken := `sandboxd_prewarm_total{event="taken"}`

	run := func(k key, script string) run {
		t.Helper()
		sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", script}})
		r := s.waitRun(k, sb["runId"].(string), 3*time.Minute)
		if r.Status != "COMPLETED" {
			t.Fatalf("run %q: %+v", script, r)
		}
		return r
	}
	first := run(ka, `set -e
echo one > /workspace/state.txt
mkdir -p /home/user/.cache && echo secret-of-a > /home/user/.cache/a
echo "$RECOUP_API_KEY" | sha256sum`)
	if first.Output["snapshotId"] == nil {
		t.Fatalf("the first run took no snapshot: %+v", first)
	}

	deadline := time.Now().Add(time.Minute)
	for s.prewarmMetric("sandboxd_prewarm_kept") < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("nothing started ahead a minute after the snapshot; logs:\n%s", s.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := s.prewarmMetric(taken)

	// The repository moves on after the sandbox was started ahead.
	repoURL := s.as(ka, "GET", "/api/sandboxes", nil).Body["github_repo"].(string)
	u, _ := url.Parse(repoURL)
	u.User = url.UserPassword("x", ka.Key)
	dir := filepath.Join(t.TempDir(), "clone")
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.test"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	if out, err := exec.Command("git", "clone", "-q", u.String(), dir).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "pushed.txt"), []byte("after the start ahead\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("add", "pushed.txt")
	git("commit", "-q", "-m", "pushed while a sandbox waited")
	git("push", "-q", "origin", "HEAD")

	second := run(ka, `cat /workspace/state.txt /home/user/.cache/a /workspace/pushed.txt; echo "$RECOUP_API_KEY" | sha256sum`)
	if got := s.prewarmMetric(taken); got != before+1 {
		t.Fatalf("the create was not served by the sandbox started ahead: taken %v, was %v", got, before)
	}
	lines := strings.Split(strings.TrimSpace(second.Output["stdout"].(string)), "\n")
	if len(lines) != 4 || lines[0] != "one" || lines[1] != "secret-of-a" || lines[2] != "after the start ahead" {
		t.Fatalf("the sandbox started ahead sees %q, want the snapshot's files and the pushed one", second.Output["stdout"])
	}
	if firstKey := strings.TrimSpace(first.Output["stdout"].(string)); lines[3] == firstKey || strings.HasPrefix(lines[3], "e3b0c442") {
		t.Fatalf("the sandbox's key is the previous sandbox's or empty (sha256 %s)", lines[3])
	}

	// Another account: a fresh sandbox, nothing of a's.
	other := run(kb, `cat /workspace/state.txt /home/user/.cache/a 2>&1; true`)
	if out := fmt.Sprint(other.Output["stdout"]); strings.Contains(out, "one") || strings.Contains(out, "secret-of-a") {
		t.Fatalf("another account's sandbox sees a's files: %q", out)
	}
	if got := s.prewarmMetric(taken); got != before+1 {
		t.Fatalf("another account's create was handed a sandbox started ahead (taken %v)", got)
	}
}
