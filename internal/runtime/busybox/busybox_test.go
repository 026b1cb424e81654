package busybox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/runtime/busybox"
)

func TestBuildRootfs(t *testing.T) {
	dir := t.TempDir()
	if err := busybox.BuildRootfs(dir); err != nil {
		t.Skipf("no static busybox here: %v", err)
	}
	for _, p := range []string{"bin/sh", "bin/wget", "bin/sha256sum", "etc/passwd", "tmp"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	// The shell works from the tree itself (it is static).
	out, err := exec.Command(filepath.Join(dir, "bin", "sh"), "-c", "echo ok").Output()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("busybox sh: %q %v", out, err)
	}
	if err := busybox.BuildRootfs(dir); err != nil {
		t.Fatalf("building over an existing tree: %v", err)
	}
}
