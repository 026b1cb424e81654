package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
)

// MicroVMOptions say what RunMicroVM measures and where.
type MicroVMOptions struct {
	Rootfs     string // base root filesystem
	StateDir   string // scratch; created and removed
	AgentPath  string
	KernelPath string // guest vmlinux; empty: the kernel cached in CacheDir
	CacheDir   string
	Accel      string // "kvm", "tcg"; empty: probe
	Iterations int    // samples per timing (default 5: TCG boots take seconds)
	Limits     runtime.Limits
	Logger     *slog.Logger
	Progress   progress.Tracker
}

// MicroVMReport is what RunMicroVM measured: the microVM backend's start
// paths side by side, in one run, with the accelerator named.
type MicroVMReport struct {
	Backend     string `json:"backend"`
	Accel       string `json:"accel"`
	KVMRejected string `json:"kvm_rejected,omitempty"`
	GuestKernel string `json:"guest_kernel"`
	CPUs        int    `json:"host_cpus"`
	GuestMiB    int64  `json:"sandbox_memory_mib"`

	ColdBoot        Timing  `json:"cold_boot"`         // Create (boot) until the agent answers
	TemplateBuildMs float64 `json:"template_build_ms"` // boot + save of the template VM
	TemplateRestore Timing  `json:"template_restore"`  // Create from the memory snapshot until the agent answers
	ExecTrue        Timing  `json:"exec_true"`         // `true` through the agent
	Pause           Timing  `json:"pause"`             // save memory to disk, QEMU gone
	Resume          Timing  `json:"resume"`            // restore until the agent answers
	ForkCount       int     `json:"fork_count"`
	Fork            Timing  `json:"fork"` // Fork of ForkCount until every child's agent answers (the parent parked, restored)
	IdleRSSMiB      float64 `json:"idle_qemu_rss_mib"`
	IdleGuestMiB    float64 `json:"idle_guest_sandbox_mib"` // Stats.MemoryBytes of an idle sandbox
}

// RunMicroVM measures the microVM backend and cleans up after itself.
func RunMicroVM(ctx context.Context, o MicroVMOptions) (_ MicroVMReport, err error) {
	if o.Iterations <= 0 {
		o.Iterations = 5
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	ph := startPhases(progress.Or(o.Progress), "kernel bench", 3)
	defer func() { ph.done(err) }()
	if o.Limits == (runtime.Limits{}) {
		o.Limits = runtime.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 1024, DiskBytes: 1 << 30}
	}
	rep := MicroVMReport{Backend: microvm.Name, CPUs: goruntime.NumCPU(), GuestMiB: o.Limits.MemoryBytes >> 20}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	defer os.RemoveAll(o.StateDir)
	ph.next("probing the accelerator and building the template")
	rt, err := microvm.New(ctx, microvm.Options{
		StateDir: filepath.Join(o.StateDir, "state"), AgentPath: o.AgentPath, KernelPath: o.KernelPath,
		CacheDir: o.CacheDir, Accel: o.Accel, DefaultLimits: o.Limits, Logger: o.Logger,
		Template: microvm.TemplateOptions{BaseDir: o.Rootfs, BaseImage: "bench"},
	})
	if err != nil {
		return rep, err
	}
	defer rt.Close()
	rep.Accel, rep.KVMRejected = rt.Accel()
	start := time.Now()
	for !rt.TemplateReady() {
		if time.Since(start) > 5*time.Minute {
			return rep, fmt.Errorf("template not ready after 5 minutes")
		}
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	rep.TemplateBuildMs = round(float64(time.Since(start).Microseconds()) / 1000)

	n := 0
	create := func(hostname string) (runtime.Sandbox, time.Duration, error) {
		n++
		// A hostname of its own makes the spec miss the template: a cold boot.
		spec := runtime.Spec{ID: fmt.Sprintf("bench-vm-%d", n), BaseDir: o.Rootfs, BaseImage: "bench", Hostname: hostname}
		t0 := time.Now()
		sb, err := rt.Create(ctx, spec)
		return sb, time.Since(t0), err
	}
	var cold, restore, execs, pause, resume []time.Duration
	ph.next("cold boots and template restores")
	for range o.Iterations {
		for _, hostname := range []string{"cold", ""} {
			sb, d, err := create(hostname)
			if err != nil {
				return rep, err
			}
			if hostname == "cold" {
				cold = append(cold, d)
			} else {
				restore = append(restore, d)
			}
			if rep.GuestKernel == "" {
				rep.GuestKernel = sb.Info().Kernel
			}
			if err := sb.Destroy(context.WithoutCancel(ctx)); err != nil {
				return rep, err
			}
		}
	}
	rep.ColdBoot, rep.TemplateRestore = timing(cold), timing(restore)

	ph.next("exec, memory, pause, resume and fork")
	sb, _, err := create("")
	if err != nil {
		return rep, err
	}
	defer sb.Destroy(context.WithoutCancel(ctx))
	for range o.Iterations * 4 {
		t0 := time.Now()
		res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"true"}})
		if err != nil || res.ExitCode != 0 {
			return rep, fmt.Errorf("exec true: %v (exit %d)", err, res.ExitCode)
		}
		execs = append(execs, time.Since(t0))
	}
	rep.ExecTrue = timing(execs)
	time.Sleep(time.Second) // let the guest settle before measuring idle memory
	if pid := microvm.PID(sb); pid > 0 {
		rep.IdleRSSMiB = rssMiB(pid)
	}
	if st, err := sb.Stats(ctx); err == nil {
		rep.IdleGuestMiB = round(float64(st.MemoryBytes) / (1 << 20))
	}
	for range o.Iterations {
		t0 := time.Now()
		if err := rt.Pause(ctx, sb.ID()); err != nil {
			return rep, err
		}
		t1 := time.Now()
		if err := rt.Resume(ctx, sb.ID()); err != nil {
			return rep, err
		}
		pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
	}
	rep.Pause, rep.Resume = timing(pause), timing(resume)
	rep.ForkCount = 5
	var forks []time.Duration
	for i := range max(1, o.Iterations/2) {
		specs := make([]runtime.Spec, rep.ForkCount)
		for j := range specs {
			specs[j] = runtime.Spec{ID: fmt.Sprintf("bench-fork-%d-%d", i, j)}
		}
		t0 := time.Now()
		kids, err := rt.Fork(ctx, sb.ID(), specs)
		if err != nil {
			return rep, err
		}
		forks = append(forks, time.Since(t0))
		for _, k := range kids {
			if err := shell(ctx, k, "true"); err != nil {
				return rep, fmt.Errorf("a child does not answer: %w", err)
			}
			_ = k.Destroy(ctx)
		}
	}
	rep.Fork = timing(forks)
	return rep, nil
}

// rssMiB is a process's resident memory.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return round(kb / 1024)
			}
		}
	}
	return 0
}
