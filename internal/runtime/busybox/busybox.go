// Package busybox builds the small root filesystem that runtime tests and
// benchmarks run on: Debian's static busybox with a symlink per applet and
// the few /etc files tools expect. It takes milliseconds, so nothing there
// depends on debootstrap. It also builds the sandbox agent from source for
// tests and benchmarks run inside this module.
package busybox

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// busyboxPaths are where a static busybox may be installed (Debian's
// busybox-static puts it in /bin).
var busyboxPaths = []string{"/bin/busybox", "/usr/bin/busybox"}

// BuildRootfs writes a minimal root filesystem into dir: a static busybox
// with a symlink per applet in /bin, /etc files that tools expect, and the
// usual top-level directories. It is a few milliseconds of work.
func BuildRootfs(dir string) error {
	var bb string
	for _, p := range busyboxPaths {
		if isStatic(p) {
			bb = p
			break
		}
	}
	if bb == "" {
		return fmt.Errorf("no static busybox in %v (apt-get install busybox-static)", busyboxPaths)
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "tmp", "var/tmp", "proc", "sys", "dev", "run", "home", "usr/share/doc"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(bb, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	files := map[string]string{
		"etc/passwd":             "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":              "root:x:0:\nnogroup:x:65534:\n",
		"etc/hostname":           "sandbox\n",
		"etc/os-release":         "NAME=\"sandboxd busybox fixture\"\nID=busybox\n",
		"usr/share/doc/README":   "base image file\n",
		"usr/share/doc/keep.txt": "kept\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func isStatic(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 4 || !bytes.Equal(b[:4], []byte("\x7fELF")) {
		return false
	}
	// A dynamic executable names its interpreter.
	return !bytes.Contains(b, []byte("/lib64/ld-linux")) && !bytes.Contains(b, []byte("/lib/ld-linux"))
}

// BuildAgent compiles the sandbox agent to out with the go tool (it must
// run inside this module).
func BuildAgent(out string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-o", out, "github.com/sandboxd/sandboxd/cmd/sandbox-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build sandbox-agent: %w\n%s", err, b)
	}
	return nil
}
