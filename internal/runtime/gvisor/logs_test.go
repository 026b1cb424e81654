package gvisor_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestAgentLogCapped floods PID 1's stdout and stderr from inside a
// sandbox, before and across a sandboxd restart: agent.log stays under its
// cap with head, marker and tail, and the agent keeps serving.
func TestAgentLogCapped(t *testing.T) {
	securitytest.Attack(t, "logs", "a gVisor guest writes 100 MiB to PID 1's stdout (/proc/1/fd/1, which runsc sends to agent.log), and floods its stderr again while sandboxd is down",
		"agent.log stays under --log-max-mib (1 MiB here) with its head, a marker counting the dropped bytes and its tail; the agent answers during and after the flood, and after the restart")
	const capBytes = 1 << 20
	state := t.TempDir()
	r := newRuntime(t, state, func(o *gvisor.Options) { o.LogMaxBytes = capBytes })
	ctx := context.Background()
	sb, err := r.Create(ctx, runtime.Spec{ID: "logs", BaseDir: runtimetest.Rootfs(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Destroy(ctx) }()
	target, err := os.Readlink(filepath.Join(state, "ids", "logs"))
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(target, "agent.log")
	if !filepath.IsAbs(logPath) {
		logPath = filepath.Join(state, "ids", logPath)
	}
	exec := func(sb runtime.Sandbox, script string) string {
		t.Helper()
		var out bytes.Buffer
		ectx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		res, err := sb.Exec(ectx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %d %v: %s", script, res.ExitCode, err, out.String())
		}
		return out.String()
	}
	start := time.Now()
	exec(sb, "head -c 104857600 /dev/zero > /proc/1/fd/1 && echo FLOOD-END > /proc/1/fd/1")
	t.Logf("100 MiB through PID 1's stdout in %s", time.Since(start).Round(time.Millisecond))
	waitLog := func(suffix string) []byte {
		t.Helper()
		var b []byte
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			b, _ = os.ReadFile(logPath)
			if bytes.HasSuffix(b, []byte(suffix)) {
				break
			}
		}
		if len(b) > capBytes {
			t.Fatalf("agent.log is %d bytes, cap %d", len(b), capBytes)
		}
		if !bytes.HasSuffix(b, []byte(suffix)) {
			t.Fatalf("agent.log (%d bytes) does not end with %q: %q", len(b), suffix, b[max(0, len(b)-80):])
		}
		if !bytes.Contains(b, []byte("[sandboxd: log truncated: ")) {
			t.Fatal("agent.log has no truncation marker")
		}
		return b
	}
	waitLog("FLOOD-END\n")
	if got := exec(sb, "echo alive"); got != "alive\n" {
		t.Fatalf("after the flood: %q", got)
	}

	// sandboxd goes away while the guest floods stderr: the flood must
	// neither kill the agent nor leave it hung once sandboxd is back.
	exec(sb, "setsid sh -c 'head -c 52428800 /dev/zero > /proc/1/fd/2; echo \"exit $?\" > /tmp/flood; echo AFTER-RESTART > /proc/1/fd/2' </dev/null >/dev/null 2>&1 &")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	r2 := newRuntime(t, state, func(o *gvisor.Options) { o.LogMaxBytes = capBytes })
	defer r2.Close()
	sb2, err := r2.Get(ctx, "logs")
	if err != nil {
		t.Fatal(err)
	}
	sb = sb2
	if got := exec(sb2, "echo alive"); got != "alive\n" {
		t.Fatalf("after the restart: %q", got)
	}
	var flood string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && flood == ""; time.Sleep(100 * time.Millisecond) {
		flood = strings.TrimSpace(exec(sb2, "cat /tmp/flood 2>/dev/null || true"))
	}
	t.Logf("flood written across the restart ended with %q", flood)
	if flood == "" {
		t.Fatal("the flood across the restart never ended")
	}
	waitLog("AFTER-RESTART\n")
}
