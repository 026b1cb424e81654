package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/kernel"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestPauseResume drives pause and resume through the API on each backend
// that pauses: a process counting in memory continues from where it was
// (it neither restarts nor counts while paused), the timeout does not run
// while paused, exec wakes a paused sandbox, a paused sandbox survives a
// SIGKILL and restart of sandboxd, a sandbox's own key may not pause it,
// and stop ends a paused sandbox.
func TestPauseResume(t *testing.T) {
	onBothBackends(t, func(t *testing.T, backend string, flags []string) {
		s := startServer(t, filepath.Join(t.TempDir(), "pause.db"), flags...)
		pauseResumeFlow(t, s, flags)
	})
}

// onBothBackends runs fn as the subtests "gvisor" and "microvm", with the
// serve flags of each; the microVM one is skipped where this host cannot
// run microVMs (see microVMReady).
func onBothBackends(t *testing.T, fn func(t *testing.T, backend string, flags []string)) {
	for _, backend := range []struct {
		name  string
		flags []string
	}{
		{"gvisor", nil},
		{"microvm", []string{"--runtime", "microvm"}},
	} {
		t.Run(backend.name, func(t *testing.T) {
			if backend.name == "microvm" && !microVMReady(t) {
				return
			}
			fn(t, backend.name, backend.flags)
		})
	}
}

func pauseResumeFlow(t *testing.T, s *server, flags []string) {
	a := s.createAccount("pauser", false)
	k := s.createKey(a.ID)
	sb := s.createSandbox(k, map[string]any{"timeout": 120000})
	id := sb["sandboxId"].(string)
	sh := func(s *server, script string) string {
		t.Helper()
		r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
		if r.Status != 200 || r.Body["exitCode"] != 0.0 {
			t.Fatalf("exec %q: %d %s", script, r.Status, r.Raw)
		}
		return r.Body["stdout"].(string)
	}
	count := func(s *server) int {
		t.Helper()
		n, err := strconv.Atoi(strings.TrimSpace(sh(s, "cat /tmp/count")))
		if err != nil {
			t.Fatalf("count: %v", err)
		}
		return n
	}
	act := func(s *server, kk key, what string, wantStatus int) map[string]any {
		t.Helper()
		r := s.as(kk, "POST", "/api/sandboxes/"+id+"/"+what, map[string]any{})
		if r.Status != wantStatus {
			t.Fatalf("%s: %d %s, want %d", what, r.Status, r.Raw, wantStatus)
		}
		if wantStatus != 200 {
			return nil
		}
		return r.Body["sandbox"].(map[string]any)
	}
	listed := func(s *server) map[string]any {
		t.Helper()
		r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil)
		sbs, _ := r.Body["sandboxes"].([]any)
		if r.Status != 200 || len(sbs) != 1 {
			t.Fatalf("list: %d %s", r.Status, r.Raw)
		}
		return sbs[0].(map[string]any)
	}

	sh(s, `(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &
echo kept > /tmp/file; sleep 1`)
	before := count(s)

	// The sandbox's own key may not pause it (a pause stops its clock).
	securitytest.Attack(t, "api", "code inside a sandbox pauses its own sandbox with its key (RECOUP_API_KEY), to stop its timeout and outlive the lifetime it was given",
		"403: a sandbox's key may not pause or resume")
	inside := key{Key: strings.TrimSpace(sh(s, `echo "$RECOUP_API_KEY"`))}
	act(s, inside, "pause", 403)

	start := time.Now()
	p := act(s, k, "pause", 200)
	// The sandbox runs on while the pause readies it (the first pause of
	// a server may wait for its runtime's save trial): up to 10 counts a
	// second of it are its own.
	readying := int(time.Since(start) / (100 * time.Millisecond))
	if p["sandboxStatus"] != "paused" {
		t.Fatalf("after pause: %v", p)
	}
	left := p["timeout"].(float64)
	time.Sleep(2 * time.Second)
	if l := listed(s); l["sandboxStatus"] != "paused" || l["timeout"].(float64) != left {
		t.Fatalf("paused for 2 s: %v (timeout was %v: the clock must not run)", l, left)
	}
	if again := act(s, k, "pause", 200); again["sandboxStatus"] != "paused" {
		t.Fatalf("pause of a paused sandbox: %v", again)
	}

	r := act(s, k, "resume", 200)
	if r["sandboxStatus"] != "running" || r["timeout"].(float64) > left {
		t.Fatalf("after resume: %v", r)
	}
	after := count(s)
	// 2 s paused would be 20 counts: it continued, it did not count on.
	if after < before || after > before+15+readying {
		t.Fatalf("counter %d before the pause, %d after it", before, after)
	}
	time.Sleep(500 * time.Millisecond)
	if later := count(s); later <= after {
		t.Fatalf("the counter stopped after resume: %d then %d", after, later)
	}

	// Exec wakes a paused sandbox.
	act(s, k, "pause", 200)
	if got := sh(s, "cat /tmp/file"); got != "kept\n" {
		t.Fatalf("exec on a paused sandbox: %q", got)
	}
	if l := listed(s); l["sandboxStatus"] != "running" {
		t.Fatalf("after the waking exec: %v", l)
	}

	// Paused across a crash and restart of sandboxd.
	mark := count(s)
	act(s, k, "pause", 200)
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()
	s2 := startServerIn(t, s.dataDir, s.dsn, flags...)
	if l := listed(s2); l["sandboxStatus"] != "paused" {
		t.Fatalf("after a restart: %v", l)
	}
	act(s2, k, "resume", 200)
	if got := count(s2); got < mark || got > mark+15 {
		t.Fatalf("after the restart the counter is %d (it was %d when paused)", got, mark)
	}

	// A pause is refused while a run executes, saying so.
	run := s2.createSandbox(k, map[string]any{"command": "sleep", "args": []string{"30"}})
	waitStatus(t, s2, k, run["runId"].(string), "EXECUTING")
	if r := s2.as(k, "POST", "/api/sandboxes/"+run["sandboxId"].(string)+"/pause", map[string]any{}); r.Status != 409 || !strings.Contains(fmt.Sprint(r.Body["error"]), "is executing") {
		t.Fatalf("pause during a run: %d %s", r.Status, r.Raw)
	}

	// Stop ends a paused sandbox; resuming it then is 409.
	act(s2, k, "pause", 200)
	if st := act(s2, k, "stop", 200); st["sandboxStatus"] != "stopped" {
		t.Fatalf("stop of a paused sandbox: %v", st)
	}
	act(s2, k, "resume", 409)
}

// microVMReady says whether this host can serve microVMs (QEMU and a
// built guest kernel in the default cache); without them the microVM case
// is skipped, or fails under SANDBOXD_REQUIRE_MICROVM=1.
func microVMReady(t *testing.T) bool {
	t.Helper()
	why := ""
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		why = "no qemu-system-x86_64"
	} else if home, err := os.UserHomeDir(); err != nil {
		why = err.Error()
	} else if ks, err := kernel.NewStore(filepath.Join(home, ".cache", "sandboxd"), nil).List(); err != nil || len(ks) == 0 {
		why = fmt.Sprintf("no guest kernel built (sandboxd kernel build): %v", err)
	}
	if why == "" {
		return true
	}
	if os.Getenv("SANDBOXD_REQUIRE_MICROVM") == "1" {
		t.Fatal(why + " (SANDBOXD_REQUIRE_MICROVM=1)")
	}
	t.Skip(why)
	return false
}
