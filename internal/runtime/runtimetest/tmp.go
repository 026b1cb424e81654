package runtimetest

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// testTmp: /tmp is memory on every backend, a tmpfs of half the sandbox's
// memory limit. df says so (not exabytes free), and a write past it fails
// with ENOSPC, leaving the sandbox and its memory to the processes, where
// an unsized tmpfs let the write run into the memory limit and be killed.
func (s *suite) testTmp(t *testing.T) {
	sb := s.create(t, runtime.Spec{Limits: runtime.Limits{MemoryBytes: 128 << 20}})
	o := run(t, sb, runtime.ExecRequest{Cmd: []string{"sh", "-c",
		"grep ' /tmp ' /proc/mounts | cut -d' ' -f3; df -k /tmp | tail -n 1 | awk '{print $2}'; " +
			"dd if=/dev/zero of=/tmp/big bs=1M count=80 2>&1 | grep -o 'No space left on device'; rm -f /tmp/big; echo alive"},
		Timeout: 2 * time.Minute})
	if got, want := strings.Fields(o.stdout), []string{"tmpfs", "65536", "No", "space", "left", "on", "device", "alive"}; o.err != nil || strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("/tmp of a 128 MiB sandbox: %v %+v\nstdout %q\nstderr %q\nwant a 64 MiB tmpfs that refuses an 80 MiB file", o.err, o.res, o.stdout, o.stderr)
	}
}
