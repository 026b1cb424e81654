package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestRunLogCapped runs a command that prints twenty times the log cap at a
// real server: the run log keeps its head and tail with a marker, and the
// run's output says that it was cut.
func TestRunLogCapped(t *testing.T) {
	securitytest.Attack(t, "logs", "a run prints 20 MiB against --log-max-mib 1 (a `yes` that would fill DATA_DIR/runs/<id>.log)",
		"the run log stays under 1 MiB with its first and last lines and a marker counting the dropped bytes; the run's output has logTruncated, logDroppedBytes and a logNote")
	const capBytes = 1 << 20
	s := startServer(t, storetest.SQLiteDSN(t), "--log-max-mib", "1")
	a := s.createAccount("chatty", false)
	k := s.createKey(a.ID)
	const script = `echo FIRST-LINE; head -c 20971520 /dev/zero | tr '\0' z; echo; echo LAST-LINE`
	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", script}})
	runID := sb["runId"].(string)
	r := s.waitRun(k, runID, 2*time.Minute)
	if r.Status != "COMPLETED" {
		t.Fatalf("run %s: %+v", r.Status, r.Error)
	}
	logPath := filepath.Join(s.dataDir, "runs", runID+".log")
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > capBytes {
		t.Fatalf("run log is %d bytes, cap %d", len(b), capBytes)
	}
	if !bytes.HasPrefix(b, []byte("[stdout] FIRST-LINE\n")) || !bytes.HasSuffix(b, []byte("LAST-LINE\n")) {
		t.Fatalf("run log lost its head or tail: %q ... %q", b[:min(40, len(b))], b[max(0, len(b)-40):])
	}
	if !bytes.Contains(b, []byte("[sandboxd: log truncated: ")) {
		t.Fatal("run log has no truncation marker")
	}
	dropped, _ := r.Output["logDroppedBytes"].(float64)
	if r.Output["logTruncated"] != true || dropped < 20<<20-capBytes || dropped > 21<<20 {
		t.Fatalf("output does not say the log was cut: truncated %v, dropped %v", r.Output["logTruncated"], r.Output["logDroppedBytes"])
	}
	note, _ := r.Output["logNote"].(string)
	if !strings.Contains(note, "dropped") {
		t.Fatalf("logNote %q", note)
	}
	if stdout, _ := r.Output["stdout"].(string); !strings.HasPrefix(stdout, "FIRST-LINE\n") || !strings.Contains(stdout, "not kept") {
		t.Fatalf("stdout in the output: %q ... %q", stdout[:min(20, len(stdout))], stdout[max(0, len(stdout)-120):])
	}
	t.Logf("run log %d bytes, %v dropped; note: %s", len(b), dropped, note)

	// A run that prints little is untouched and says nothing.
	sb = s.createSandbox(k, map[string]any{"command": "echo", "args": []string{"quiet"}})
	r = s.waitRun(k, sb["runId"].(string), time.Minute)
	if r.Status != "COMPLETED" || r.Output["stdout"] != "quiet\n" || r.Output["logTruncated"] != nil || r.Output["logNote"] != nil {
		t.Fatalf("quiet run: %+v", r)
	}
	s.stopAll(k)
}
