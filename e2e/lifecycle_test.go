package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// run is the part of a Run object the tests read.
type run struct {
	ID     string
	Status string
	Output map[string]any
	Error  map[string]any
}

// createSandbox posts a create request and returns the sandbox object.
func (s *server) createSandbox(k key, body map[string]any) map[string]any {
	s.t.Helper()
	r := s.as(k, "POST", "/api/sandboxes", body)
	if r.Status != 200 {
		s.t.Fatalf("create sandbox: %d %s", r.Status, r.Raw)
	}
	sbs := r.Body["sandboxes"].([]any)
	if len(sbs) != 1 {
		s.t.Fatalf("create answered %d sandboxes", len(sbs))
	}
	return sbs[0].(map[string]any)
}

// waitRun polls a run until it is completed (or the timeout passes).
func (s *server) waitRun(k key, runID string, timeout time.Duration) run {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := s.as(k, "GET", "/api/tasks/runs?runId="+runID, nil)
		if r.Status != 200 {
			s.t.Fatalf("get run %s: %d %s", runID, r.Status, r.Raw)
		}
		v := r.Body["runs"].([]any)[0].(map[string]any)
		if v["isCompleted"] == true || time.Now().After(deadline) {
			out := run{ID: runID, Status: v["status"].(string)}
			out.Output, _ = v["output"].(map[string]any)
			out.Error, _ = v["error"].(map[string]any)
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sandboxStatus returns a sandbox's status from the list route.
func (s *server) sandboxStatus(k key, id string) (string, float64) {
	s.t.Helper()
	r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil)
	if r.Status != 200 {
		s.t.Fatalf("get sandbox %s: %d %s", id, r.Status, r.Raw)
	}
	sb := r.Body["sandboxes"].([]any)[0].(map[string]any)
	return sb["sandboxStatus"].(string), sb["timeout"].(float64)
}

// runtimeHas reports whether the runtime still holds the sandbox on the host.
func (s *server) runtimeHas(id string) bool {
	_, err := os.Lstat(filepath.Join(s.dataDir, "runtime", "gvisor", "ids", id))
	return err == nil
}

func TestLifecycle(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, dsn string) {
		s := startServer(t, dsn)
		alice := s.createAccount("alice", false)
		bob := s.createAccount("bob", false)
		ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)

		t.Run("command run completes with its output", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{"command": "sh", "args": []string{"-c", "echo hi; uname -r"}})
			if sb["sandboxStatus"] != "running" || sb["timeout"].(float64) <= 0 || sb["runId"] == nil {
				t.Fatalf("sandbox %v", sb)
			}
			r := s.waitRun(ak, sb["runId"].(string), time.Minute)
			if r.Status != "COMPLETED" || r.Output["exitCode"] != 0.0 {
				t.Fatalf("run %+v", r)
			}
			// gVisor's kernel release, not the host's.
			if !guestKernelAfter(r.Output["stdout"].(string), "hi\n") {
				t.Fatalf("stdout %q", r.Output["stdout"])
			}
			if r.Output["sandboxId"] != sb["sandboxId"] {
				t.Fatalf("output names sandbox %v", r.Output["sandboxId"])
			}
		})

		t.Run("failing command completes with its exit code", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{"command": "sh", "args": []string{"-c", "echo no >&2; exit 3"}})
			r := s.waitRun(ak, sb["runId"].(string), time.Minute)
			if r.Status != "COMPLETED" || r.Output["exitCode"] != 3.0 || r.Output["stderr"] != "no\n" {
				t.Fatalf("run %+v", r)
			}
		})

		t.Run("missing command fails with a clear error", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{"command": "no-such-tool"})
			r := s.waitRun(ak, sb["runId"].(string), time.Minute)
			if r.Status != "FAILED" || !strings.Contains(fmt.Sprint(r.Error["message"]), "command not found: no-such-tool") || r.Output["exitCode"] != 127.0 {
				t.Fatalf("run %+v", r)
			}
		})

		t.Run("exec, streamed exec and stop", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{})
			id := sb["sandboxId"].(string)
			if _, ok := sb["runId"]; ok {
				t.Fatalf("runId without a command: %v", sb)
			}
			r := s.as(ak, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "cat; pwd; echo $X"}, "stdin": "in\n", "env": map[string]string{"X": "y"}})
			if r.Status != 200 || r.Body["stdout"] != "in\n/workspace\ny\n" || r.Body["exitCode"] != 0.0 {
				t.Fatalf("exec: %d %s", r.Status, r.Raw)
			}
			raw := s.call("POST", "/api/sandboxes/"+id+"/exec", map[string]string{"x-api-key": ak.Key, "Accept": "text/event-stream"},
				map[string]any{"command": "sh", "args": []string{"-c", "echo a; echo b >&2; exit 2"}}).Raw
			for _, want := range []string{"event: stdout\ndata: {\"data\":\"a\\n\"}", "event: stderr\ndata: {\"data\":\"b\\n\"}", "event: exit\ndata: {\"durationMs\":"} {
				if !strings.Contains(string(raw), want) {
					t.Fatalf("stream lacks %q:\n%s", want, raw)
				}
			}
			if !strings.Contains(string(raw), `"exitCode":2}`) {
				t.Fatalf("stream exit code:\n%s", raw)
			}
			// Another account sees none of it.
			if r := s.as(bk, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "true"}); r.Status != 404 {
				t.Fatalf("foreign exec: %d", r.Status)
			}
			if r := s.as(bk, "GET", "/api/sandboxes?sandbox_id="+id, nil); r.Status != 200 || len(r.Body["sandboxes"].([]any)) != 0 {
				t.Fatalf("foreign sandbox_id: %d %s, want 200 and no sandboxes", r.Status, r.Raw)
			}
			r = s.as(ak, "POST", "/api/sandboxes/"+id+"/stop", nil)
			if r.Status != 200 || r.Body["sandbox"].(map[string]any)["sandboxStatus"] != "stopped" {
				t.Fatalf("stop: %d %s", r.Status, r.Raw)
			}
			if s.runtimeHas(id) {
				t.Fatal("runtime still holds the stopped sandbox")
			}
			if r := s.as(ak, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "true"}); r.Status != 409 {
				t.Fatalf("exec in stopped sandbox: %d %s", r.Status, r.Raw)
			}
		})

		t.Run("sandbox stops at its timeout", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{"timeout": 3000, "command": "sleep", "args": []string{"60"}})
			id := sb["sandboxId"].(string)
			if sb["timeout"].(float64) > 3000 {
				t.Fatalf("timeout %v", sb["timeout"])
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				status, remaining := s.sandboxStatus(ak, id)
				if status == "stopped" {
					if remaining != 0 {
						t.Fatalf("stopped sandbox has timeout %v", remaining)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("sandbox still %s long after its timeout", status)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if s.runtimeHas(id) {
				t.Fatal("runtime still holds the expired sandbox")
			}
			r := s.waitRun(ak, sb["runId"].(string), 30*time.Second)
			if r.Status != "FAILED" || !strings.Contains(fmt.Sprint(r.Error["message"]), "reached its timeout") {
				t.Fatalf("run cut by the timeout is %s: %+v", r.Status, r)
			}
		})

		t.Run("another account's run is not found", func(t *testing.T) {
			sb := s.createSandbox(ak, map[string]any{"command": "true"})
			if r := s.as(bk, "GET", "/api/tasks/runs?runId="+sb["runId"].(string), nil); r.Status != 404 || r.Body["error"] != "Task run not found" {
				t.Fatalf("foreign run: %d %s", r.Status, r.Raw)
			}
		})
	})
}

// TestLoad creates 20 sandboxes at once, each running a command, and checks
// that no run is lost or stuck. Figures are logged, not asserted.
func TestLoad(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "load.db"), "--max-sandboxes-per-account", "0", "--warm-pool", "4")
	a := s.createAccount("load", false)
	k := s.createKey(a.ID)
	const n = 20
	var wg sync.WaitGroup
	runIDs := make([]string, n)
	latency := make([]time.Duration, n)
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			t0 := time.Now()
			sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", fmt.Sprintf("echo %d", i)}})
			latency[i] = time.Since(t0)
			runIDs[i] = sb["runId"].(string)
		})
	}
	wg.Wait()
	created := time.Since(start)
	for i, id := range runIDs {
		r := s.waitRun(k, id, 2*time.Minute)
		if r.Status != "COMPLETED" || r.Output["stdout"] != fmt.Sprintf("%d\n", i) {
			t.Fatalf("run %d: %+v", i, r)
		}
	}
	all := time.Since(start)
	var worst time.Duration
	for _, l := range latency {
		worst = max(worst, l)
	}
	t.Logf("load: %d sandboxes created in %v (slowest create %v), all %d runs completed after %v", n, created, worst, n, all)
}

// TestQuota: over the per-account limit, creation answers 429 with a clear
// message; stopping a sandbox makes room again.
func TestQuota(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "quota.db"), "--max-sandboxes-per-account", "2")
	a := s.createAccount("busy", false)
	k := s.createKey(a.ID)
	first := s.createSandbox(k, map[string]any{})
	s.createSandbox(k, map[string]any{})
	r := s.as(k, "POST", "/api/sandboxes", map[string]any{})
	if r.Status != 429 || !strings.Contains(fmt.Sprint(r.Body["error"]), "limit is 2") {
		t.Fatalf("third sandbox: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+first["sandboxId"].(string)+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}
	s.createSandbox(k, map[string]any{})
}

// guestKernelAfter: out is prefix and then a kernel release that gVisor
// reports, not the host's: "4.4.0" from Debian's 2022 runsc,
// "4.19.0-gvisor" from a current one.
func guestKernelAfter(out, prefix string) bool {
	rel, ok := strings.CutPrefix(out, prefix)
	rel = strings.TrimSpace(rel)
	var u unix.Utsname
	if !ok || unix.Uname(&u) != nil || rel == unix.ByteSliceToString(u.Release[:]) {
		return false
	}
	return rel == "4.4.0" || strings.HasSuffix(rel, "-gvisor")
}
