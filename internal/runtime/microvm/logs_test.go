package microvm_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestConsoleLogCapped floods the VM's serial console from inside, before
// and across a sandboxd restart: console.log stays under its cap with head,
// marker and tail, and the guest keeps running.
func TestConsoleLogCapped(t *testing.T) {
	securitytest.Attack(t, "logs", "a microVM guest writes its serial console (/dev/ttyS0) far past the log cap, and again while sandboxd is down",
		"console.log, which QEMU no longer writes itself (the console is a socket chardev sandboxd reads), stays under --log-max-mib (256 KiB here) with head, marker and tail; while sandboxd is away the console drops its output and the guest goes on")
	const capBytes = 256 << 10
	base := runtimetest.Rootfs(t)
	state := t.TempDir()
	mod := func(o *microvm.Options) { o.LogMaxBytes = capBytes }
	r := newRuntime(t, state, mod)
	ctx := context.Background()
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	sb, err := r.Create(cctx, runtime.Spec{ID: "console", BaseDir: base})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sb.Destroy(ctx) }()
	target, err := os.Readlink(filepath.Join(state, "ids", "console"))
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(state, "ids", target)
	}
	logPath := filepath.Join(target, "console.log")
	exec := func(sb runtime.Sandbox, script string) string {
		t.Helper()
		var out bytes.Buffer
		ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		res, err := sb.Exec(ectx, runtime.ExecRequest{Cmd: []string{"sh", "-c", script}, Stdout: &out, Stderr: &out})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("%s: %d %v: %s", script, res.ExitCode, err, out.String())
		}
		return out.String()
	}
	// The sandbox may have no device node for the console: root makes one.
	const tty = "[ -c /tmp/ttyS0 ] || mknod /tmp/ttyS0 c 4 64; "
	start := time.Now()
	exec(sb, tty+"head -c 2097152 /dev/zero | tr '\\0' x > /tmp/ttyS0 && echo CONSOLE-END > /tmp/ttyS0")
	t.Logf("2 MiB through the serial console in %s", time.Since(start).Round(time.Millisecond))
	waitLog := func(suffix string) {
		t.Helper()
		var b []byte
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			b, _ = os.ReadFile(logPath)
			if bytes.Contains(b[max(0, len(b)-200):], []byte(suffix)) {
				break
			}
		}
		if len(b) > capBytes {
			t.Fatalf("console.log is %d bytes, cap %d", len(b), capBytes)
		}
		if !bytes.Contains(b[max(0, len(b)-200):], []byte(suffix)) {
			t.Fatalf("console.log (%d bytes) does not end with %q: %q", len(b), suffix, b[max(0, len(b)-80):])
		}
		if !bytes.Contains(b, []byte("[sandboxd: log truncated: ")) {
			t.Fatal("console.log has no truncation marker")
		}
	}
	waitLog("CONSOLE-END")
	if _, err := os.Stat(filepath.Join(target, "jail", "run", "console.log")); err == nil {
		t.Fatal("QEMU still writes a console file in its jail")
	}

	// sandboxd goes away while the guest writes its console.
	exec(sb, tty+"setsid sh -c 'head -c 1048576 /dev/zero | tr \"\\0\" y > /tmp/ttyS0; echo \"exit $?\" > /tmp/flood; sleep 3; echo AFTER-RESTART > /tmp/ttyS0' </dev/null >/dev/null 2>&1 &")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	r2 := newRuntime(t, state, mod)
	defer r2.Close()
	sb2, err := r2.Get(ctx, "console")
	if err != nil {
		t.Fatal(err)
	}
	sb = sb2
	if got := exec(sb2, "echo alive"); got != "alive\n" {
		t.Fatalf("after the restart: %q", got)
	}
	var flood string
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline) && flood == ""; time.Sleep(200 * time.Millisecond) {
		flood = strings.TrimSpace(exec(sb2, "cat /tmp/flood 2>/dev/null || true"))
	}
	t.Logf("console flood across the restart ended with %q", flood)
	if flood == "" {
		t.Fatal("the console flood across the restart never ended")
	}
	waitLog("AFTER-RESTART")
}
