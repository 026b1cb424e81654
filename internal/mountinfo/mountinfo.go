// Package mountinfo reads this process's mount table
// (/proc/self/mountinfo): which paths are mount points. The runtime backends
// use it to unmount what they mounted and to check that nothing is left;
// the image builder to refuse to delete through a mount.
package mountinfo

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Under lists the mount points at or below dir, in mount order.
func Under(dir string) ([]string, error) {
	var out []string
	err := each(func(mp string) {
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	})
	return out, err
}

// IsMountPoint reports whether path is a mount point; false when the table
// cannot be read.
func IsMountPoint(path string) bool {
	found := false
	_ = each(func(mp string) { found = found || mp == path })
	return found
}

// each calls fn with every mount point of the table.
func each(fn func(mountPoint string)) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// Field 5 is the mount point, with spaces and the like escaped as
		// octal (\040).
		if fields := strings.Fields(sc.Text()); len(fields) >= 5 {
			fn(Unescape(fields[4]))
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read mount table: %w", err)
	}
	return nil
}

// Unescape decodes mountinfo's octal escapes (\040 for a space); anything
// that is not a three-digit octal byte stays as it is.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
