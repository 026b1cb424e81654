package gvisor

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
	"github.com/sandboxd/sandboxd/internal/securitytest"
)

func TestTaskCeiling(t *testing.T) {
	cases := []struct {
		name               string
		pidMax, threadsMax int64
		sandboxes          int
		want               int64
	}{
		{"this kind of host: 32768 pids, 200 sandboxes", 32768, 192726, 200, 4096},
		{"big host: equal share", 4194304, 1 << 20, 100, 10485},
		{"threads-max lower than pid_max", 4194304, 65536, 200, 4096},
		{"tiny host: a quarter at most", 8000, 0, 2, 2000},
		{"capacity unknown: a quarter", 4194304, 4194304, 0, 1048576},
		{"nothing known", 0, 0, 10, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := taskCeiling(tc.pidMax, tc.threadsMax, tc.sandboxes); got != tc.want {
				t.Fatalf("taskCeiling(%d, %d, %d) = %d, want %d", tc.pidMax, tc.threadsMax, tc.sandboxes, got, tc.want)
			}
		})
	}
}

func readProcInt(t *testing.T, path string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Skip(err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestPidsBackstopWithinHostMeans builds the OCI spec runsc gets, on this
// host, for the default limits and for an operator's huge --sandbox-pids:
// the cgroup's pids.max never exceeds a quarter of what the host has.
func TestPidsBackstopWithinHostMeans(t *testing.T) {
	securitytest.Attack(t, "host", "a sandbox (512 pids inside, or a misconfigured 100,000) runs away on the host's tasks under the ptrace platform, past pid_max",
		"the host cgroup's pids backstop is derived from pid_max, threads-max and the node's capacity: at most its share, never over a quarter of the host")
	budget := min(readProcInt(t, "/proc/sys/kernel/pid_max"), readProcInt(t, "/proc/sys/kernel/threads-max"))
	ceiling := hostTaskCeiling(200)
	if ceiling <= 0 || ceiling > budget/4 {
		t.Fatalf("ceiling %d for a host with %d tasks", ceiling, budget)
	}
	for _, pids := range []int64{512, 100000} {
		m := &meta{Record: host.Record{ID: "sbx-pids", Limits: runtime.Limits{Pids: pids, MemoryBytes: 256 << 20}}}
		spec := buildSpec(m, "/rootfs", "/bin", "/sock", "/hosts", "", ceiling)
		if spec.Linux.Resources == nil || spec.Linux.Resources.Pids == nil || spec.Linux.Resources.Pids.Limit == nil {
			t.Fatalf("pids %d: no pids limit in the spec", pids)
		}
		got := *spec.Linux.Resources.Pids.Limit
		if got > budget/4 || got > pids*64+4096 {
			t.Fatalf("pids %d: host backstop %d on a host with %d tasks", pids, got, budget)
		}
		t.Logf("pids %d inside: host pids.max %d (host has %d tasks)", pids, got, budget)
	}
}
