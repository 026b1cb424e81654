package bench_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

// TestRunMicroVMSmall runs every microVM phase once or twice: it checks the
// bench works and fills its report, not how fast anything is. It needs
// QEMU and the guest kernel (SANDBOXD_MICROVM_KERNEL or the cache).
func TestRunMicroVMSmall(t *testing.T) {
	runtimetest.Require(t, "mkfs.ext4")
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		if os.Getenv("SANDBOXD_REQUIRE_MICROVM") == "1" {
			t.Fatal("qemu-system-x86_64 missing (SANDBOXD_REQUIRE_MICROVM=1)")
		}
		t.Skip("needs qemu-system-x86_64 (apt-get install qemu-system-x86)")
	}
	rep, err := bench.RunMicroVM(context.Background(), bench.MicroVMOptions{
		Rootfs:     runtimetest.Rootfs(t),
		StateDir:   filepath.Join(t.TempDir(), "state"),
		AgentPath:  runtimetest.AgentBinary(t),
		KernelPath: os.Getenv("SANDBOXD_MICROVM_KERNEL"),
		CacheDir:   os.Getenv("SANDBOXD_CACHE_DIR"),
		Iterations: 1,
	})
	if err != nil {
		if os.Getenv("SANDBOXD_REQUIRE_MICROVM") != "1" && os.Getenv("SANDBOXD_MICROVM_KERNEL") == "" {
			t.Skipf("microVM bench could not start (guest kernel built? `sandboxd kernel build`): %v", err)
		}
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	for name, tm := range map[string]bench.Timing{
		"cold_boot": rep.ColdBoot, "template_restore": rep.TemplateRestore, "exec_true": rep.ExecTrue,
		"pause": rep.Pause, "resume": rep.Resume, "fork": rep.Fork,
	} {
		if tm.N == 0 || tm.P50 <= 0 {
			t.Errorf("%s: %+v", name, tm)
		}
	}
	if rep.Accel == "" || rep.GuestKernel == "" || rep.IdleRSSMiB <= 0 {
		t.Errorf("report %+v", rep)
	}
}
