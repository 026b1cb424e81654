package gvisor_test

import (
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
	runtimetest.TestLogCap(t, runtimetest.LogCap{
		Open: func(t *testing.T, state string) runtime.Runtime {
			return newRuntime(t, state, func(o *gvisor.Options) { o.LogMaxBytes = capBytes })
		},
		CapBytes: capBytes,
		File:     "agent.log",
		// A current gVisor applies Linux's ptrace access check to
		// /proc/1/fd of the agent, which is not dumpable, and the guest
		// lacks CAP_SYS_PTRACE: the flood cannot even start there (EACCES).
		// Debian's 2022 runsc let it through.
		Flood: "if head -c 104857600 /dev/zero > /proc/1/fd/1; then echo FLOOD-END > /proc/1/fd/1; " +
			"else echo 'FLOOD-BLOCKED: /proc/1/fd/1 cannot be opened'; fi",
		FloodAcrossRestart: `head -c 52428800 /dev/zero > /proc/1/fd/2; echo "exit $?" > /tmp/flood; echo AFTER-RESTART > /proc/1/fd/2`,
		Timeout:            time.Minute,
	})
}
