package agent

import (
	"syscall"
	"testing"
)

func TestParseOOMKills(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n", 2, true},
		{"oom_kill 0", 0, true},
		{"low 0\nhigh 0\n", 0, false},
		{"oom_kill x\n", 0, false},
		{"", 0, false},
	} {
		got, ok := parseOOMKills([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %d %v, want %d %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestKilledLike(t *testing.T) {
	// A wait status is the kernel's encoding: exit code in bits 8-15,
	// terminating signal in bits 0-6.
	for _, tc := range []struct {
		ws   syscall.WaitStatus
		want bool
	}{
		{syscall.WaitStatus(syscall.SIGKILL), true},
		{syscall.WaitStatus(137 << 8), true},
		{syscall.WaitStatus(syscall.SIGTERM), false},
		{syscall.WaitStatus(1 << 8), false},
		{syscall.WaitStatus(0), false},
	} {
		if got := killedLike(tc.ws); got != tc.want {
			t.Errorf("status %#x: %v, want %v", int(tc.ws), got, tc.want)
		}
	}
}
