package host

// What a backend's probes of the host (which platform or accelerator
// works here) share: the kernel they are cached by, and the last words of
// a trial that failed.

import (
	"strings"

	"golang.org/x/sys/unix"
)

// Uname is the host kernel's release and version (uname -r and -v); both
// "" when uname fails.
func Uname() (release, version string) {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "", ""
	}
	return unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:])
}

// LastLine is the last line of s, trimmed: what a command that failed
// said last.
func LastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
