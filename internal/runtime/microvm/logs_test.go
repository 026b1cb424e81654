package microvm_test

import (
	"os"
	"path/filepath"
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
	// The sandbox may have no device node for the console: root makes one,
	// on the root file system (/tmp is a tmpfs without devices).
	const tty = "[ -c /ttyS0 ] || mknod /ttyS0 c 4 64; "
	runtimetest.TestLogCap(t, runtimetest.LogCap{
		Open: func(t *testing.T, state string) runtime.Runtime {
			return newRuntime(t, state, func(o *microvm.Options) { o.LogMaxBytes = capBytes })
		},
		CapBytes:           capBytes,
		File:               "console.log",
		Flood:              tty + "head -c 2097152 /dev/zero | tr '\\0' x > /ttyS0 && echo FLOOD-END > /ttyS0",
		FloodAcrossRestart: tty + `head -c 1048576 /dev/zero | tr "\0" y > /ttyS0; echo "exit $?" > /tmp/flood; sleep 3; echo AFTER-RESTART > /ttyS0`,
		Timeout:            2 * time.Minute,
		Check: func(t *testing.T, dir string) {
			if _, err := os.Stat(filepath.Join(dir, "jail", "run", "console.log")); err == nil {
				t.Fatal("QEMU still writes a console file in its jail")
			}
		},
	})
}
