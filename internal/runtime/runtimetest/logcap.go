package runtimetest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// LogCap describes one backend's capped guest log for TestLogCap: the file
// the host writes what the guest prints to, and how a guest floods it.
type LogCap struct {
	// Open starts the backend on stateDir with its log cap set to CapBytes;
	// it is called twice, the second time after the first was closed (a
	// sandboxd restart).
	Open func(t *testing.T, stateDir string) runtime.Runtime
	// CapBytes is the cap Open sets.
	CapBytes int
	// File is the log's name in the sandbox's state directory.
	File string
	// Flood is a script that writes far past the cap into the log and then
	// a line ending in "FLOOD-END" (or prints "FLOOD-BLOCKED: why" when the
	// guest cannot reach the log at all, and the test is skipped); FloodAcrossRestart does the same in the
	// background, writes "exit $?" to /tmp/flood when its writes return and
	// then a line "AFTER-RESTART".
	Flood, FloodAcrossRestart string
	// Timeout bounds each command and each wait for the log (a slow VM
	// console takes longer than a gVisor pipe).
	Timeout time.Duration
	// Check, when not nil, runs once the first flood is in the log, with
	// the sandbox's state directory.
	Check func(t *testing.T, dir string)
}

// TestLogCap floods a guest log from inside a sandbox, before and across a
// sandboxd restart: the log stays under its cap with head, truncation
// marker and tail, and the sandbox keeps serving during and after.
func TestLogCap(t *testing.T, lc LogCap) {
	const id = "logs"
	state := t.TempDir()
	r := lc.Open(t, state)
	// Closed before state goes, also when the test ends early (a skip): a
	// runtime's work in the background may write there.
	defer r.Close()
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	sb, err := r.Create(cctx, runtime.Spec{ID: id, BaseDir: Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Destroy(ctx) }()
	dir, err := os.Readlink(filepath.Join(state, "ids", id))
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(state, "ids", dir)
	}
	logPath := filepath.Join(dir, lc.File)
	exec := func(sb runtime.Sandbox, script string) string {
		t.Helper()
		var out bytes.Buffer
		ectx, cancel := context.WithTimeout(ctx, lc.Timeout)
		defer cancel()
		res, err := sb.Exec(ectx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %d %v: %s", script, res.ExitCode, err, out.String())
		}
		return out.String()
	}
	// The log ends with marker, give or take the line end the guest's
	// terminal adds.
	waitLog := func(marker string) {
		t.Helper()
		var b []byte
		tail := func() []byte { return b[max(0, len(b)-200):] }
		for deadline := time.Now().Add(lc.Timeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			b, _ = os.ReadFile(logPath)
			if bytes.Contains(tail(), []byte(marker)) {
				break
			}
		}
		if len(b) > lc.CapBytes {
			t.Fatalf("%s is %d bytes, cap %d", lc.File, len(b), lc.CapBytes)
		}
		if !bytes.Contains(tail(), []byte(marker)) {
			t.Fatalf("%s (%d bytes) does not end with %q: %q", lc.File, len(b), marker, b[max(0, len(b)-80):])
		}
		if !bytes.Contains(b, []byte("[sandboxd: log truncated: ")) {
			t.Fatalf("%s has no truncation marker", lc.File)
		}
	}
	start := time.Now()
	if out := exec(sb, lc.Flood); strings.Contains(out, "FLOOD-BLOCKED") {
		t.Skipf("the guest cannot write into %s: %s", lc.File, strings.TrimSpace(out))
	}
	t.Logf("flood written in %s", time.Since(start).Round(time.Millisecond))
	waitLog("FLOOD-END")
	if got := exec(sb, "echo alive"); got != "alive\n" {
		t.Fatalf("after the flood: %q", got)
	}
	if lc.Check != nil {
		lc.Check(t, dir)
	}

	// sandboxd goes away while the guest floods: the flood must neither
	// kill the guest nor leave it hung once sandboxd is back.
	exec(sb, "setsid sh -c '"+lc.FloodAcrossRestart+"' </dev/null >/dev/null 2>&1 &")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	r2 := lc.Open(t, state)
	defer r2.Close()
	sb2, err := r2.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	sb = sb2
	if got := exec(sb2, "echo alive"); got != "alive\n" {
		t.Fatalf("after the restart: %q", got)
	}
	var flood string
	for deadline := time.Now().Add(lc.Timeout); time.Now().Before(deadline) && flood == ""; time.Sleep(200 * time.Millisecond) {
		flood = strings.TrimSpace(exec(sb2, "cat /tmp/flood 2>/dev/null || true"))
	}
	t.Logf("flood written across the restart ended with %q", flood)
	if flood == "" {
		t.Fatal("the flood across the restart never ended")
	}
	waitLog("AFTER-RESTART")
}
