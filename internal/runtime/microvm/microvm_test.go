package microvm_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
	"github.com/sandboxd/sandboxd/internal/runtime/runtimetest"
)

func newRuntime(t *testing.T, stateDir string, mod func(*microvm.Options)) *microvm.Runtime {
	t.Helper()
	k := runtimetest.MicroVMKernel(t)
	opts := microvm.Options{
		StateDir:   stateDir,
		KernelPath: k,
		AgentPath:  runtimetest.AgentBinary(t),
		Logger:     runtimetest.Logger(t),
		// Small VMs keep a dozen of them cheap on a CI machine.
		DefaultLimits: runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 512, DiskBytes: 256 << 20},
	}
	return runtimetest.Open(t, microvm.New, opts, mod)
}

// TestConformance runs the runtime conformance suite. Under TCG (no usable
// KVM) every VM boots in software emulation: the suite takes minutes.
func TestConformance(t *testing.T) {
	runtimetest.Run(t, runtimetest.Harness{New: runtimetest.Opener(newRuntime), Leaks: leaks})
}

// leaks lists what is left of a sandbox on the host after Destroy: what
// every backend leaves (runtimetest.HostLeaks) and the QEMU process.
var leaks = runtimetest.HostLeaks(func(t *testing.T, stateDir, cid string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("qemu")) {
			if root, err := os.Readlink(filepath.Join(filepath.Dir(p), "root")); err == nil && strings.Contains(root, cid) {
				out = append(out, "process "+strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
	}
	return out
})

// TestJail checks the QEMU process's confinement from the host's side.
func TestJail(t *testing.T) {
	base := runtimetest.Rootfs(t)
	r := newRuntime(t, t.TempDir(), nil)
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb, err := r.Create(ctx, runtime.Spec{ID: "jailed", BaseDir: base})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	pid := microvm.PID(sb)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			fields[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	if uid := strings.Fields(fields["Uid"]); len(uid) == 0 || uid[0] == "0" {
		t.Errorf("QEMU runs as uid %q", fields["Uid"])
	}
	if fields["CapEff"] != "0000000000000000" {
		t.Errorf("QEMU has capabilities %s", fields["CapEff"])
	}
	if fields["Seccomp"] != "2" {
		t.Errorf("QEMU is not under a seccomp filter: Seccomp %q", fields["Seccomp"])
	}
	if fields["NoNewPrivs"] != "1" {
		t.Errorf("QEMU may gain privileges: NoNewPrivs %q", fields["NoNewPrivs"])
	}
	for _, ns := range []string{"mnt", "pid", "net", "ipc", "uts"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil || its == mine {
			t.Errorf("QEMU shares the host's %s namespace (%v)", ns, err)
		}
	}
	root, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
	if !strings.HasSuffix(root, "/jail") {
		t.Errorf("QEMU's root is %q, want its jail", root)
	}
	info := sb.Info()
	accel, why := r.Accel()
	if info.Platform != accel {
		t.Errorf("info %+v, accel %s (%s)", info, accel, why)
	}
	t.Logf("accelerator %s; KVM rejected because: %s", accel, why)
}
