package image

import (
	"os"
	"path/filepath"
	"slices"
)

// searchPath is the PATH of processes in a sandbox (the agent's default).
var searchPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// HasCommand reports whether the root filesystem at rootfs has an
// executable name in the sandbox's PATH. A symlink counts when it is one
// (npm's global installs are symlinks into node_modules): the sandbox, not
// the host, resolves it.
func HasCommand(rootfs, name string) bool {
	for _, dir := range searchPath {
		fi, err := os.Lstat(filepath.Join(rootfs, dir, name))
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 || (fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0) {
			return true
		}
	}
	return false
}

// TemplateWith names the smallest built-in template whose image adds the
// agent CLI name, or "" when none does.
func TemplateWith(name string) string {
	for _, t := range Templates() {
		if slices.Contains(t.Commands, name) {
			return t.Name
		}
	}
	return ""
}
