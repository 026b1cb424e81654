package runtimetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/kernel"
)

// MicroVMKernel returns the guest kernel for microVM tests, and skips the
// test unless it runs as root with QEMU and the kernel here (from
// SANDBOXD_MICROVM_KERNEL or the cache, see microVMKernelPath), or fails
// with SANDBOXD_REQUIRE_MICROVM=1.
func MicroVMKernel(t testing.TB) string {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	for _, tool := range []string{"qemu-system-x86_64", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool+" (apt-get install qemu-system-x86 e2fsprogs)")
		}
	}
	k, err := microVMKernelPath()
	if err != nil {
		missing = append(missing, fmt.Sprintf("the guest kernel (%v)", err))
	}
	if len(missing) == 0 {
		return k
	}
	msg := "microVM tests need " + strings.Join(missing, ", ")
	if os.Getenv("SANDBOXD_REQUIRE_MICROVM") == "1" {
		t.Fatal(msg + " (SANDBOXD_REQUIRE_MICROVM=1)")
	}
	t.Skip(msg)
	return ""
}

// microVMKernelPath is SANDBOXD_MICROVM_KERNEL, or the kernel `sandboxd
// kernel build` cached in SANDBOXD_CACHE_DIR (default: the user cache dir).
func microVMKernelPath() (string, error) {
	if p := os.Getenv("SANDBOXD_MICROVM_KERNEL"); p != "" {
		_, err := os.Stat(p)
		return p, err
	}
	cache := os.Getenv("SANDBOXD_CACHE_DIR")
	if cache == "" {
		d, err := os.UserCacheDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(d, "sandboxd")
	}
	k, err := kernel.NewStore(cache, nil).Lookup("")
	if err != nil {
		return "", err
	}
	return k.Path, nil
}
