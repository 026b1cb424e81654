package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/progress"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// DensityOptions configure the density benchmark: how many idle sandboxes
// this host holds, and what one costs.
type DensityOptions struct {
	Rootfs    string // base root filesystem
	StateDir  string // scratch; created and removed
	AgentPath string
	RunscPath string
	Platform  string // empty: probed
	// Max is the most sandboxes started (the node's capacity, 200 by
	// default, as serve's --node-capacity).
	Max int
	// ReserveBytes of the host's available memory are never used: the
	// benchmark stops before MemAvailable would fall below it (2 GiB).
	ReserveBytes int64
	Limits       runtime.Limits
	Logger       *slog.Logger
	Progress     progress.Tracker
}

// DensityReport is what RunDensity measured. Sizes are MiB.
type DensityReport struct {
	Platform string `json:"platform"`
	Rootfs   string `json:"rootfs"`
	CPUs     int    `json:"host_cpus"`
	// Started idle sandboxes, all answering at the end (Alive); Stop says
	// which limit ended the run.
	Started int    `json:"started"`
	Alive   int    `json:"alive"`
	Stop    string `json:"stop"`
	// Exec is an exec of `true` in each, one after another, once all
	// are started and idle; ExecWithin1s counts those answered within a
	// second.
	Exec         Timing `json:"exec_true"`
	ExecWithin1s int    `json:"exec_within_1s"`
	// StartAll is the time to start them one after another; Start the
	// distribution of one start, first and last tenth (does a full host
	// start slower?).
	StartAllMs      float64 `json:"start_all_ms"`
	StartFirstTenth Timing  `json:"start_first_tenth"`
	StartLastTenth  Timing  `json:"start_last_tenth"`
	// Starts is each start in ms, in order: the n-th started with n-1
	// sandboxes running.
	Starts []float64 `json:"starts_ms,omitempty"`
	// Per idle sandbox: RSS and PSS of sentry and gofer, the memory cgroup,
	// the host's MemAvailable drop, and the data disk's blocks.
	RSSMiB          float64 `json:"rss_mib_per_sandbox"`
	PSSMiB          float64 `json:"pss_mib_per_sandbox"`
	CgroupMiB       float64 `json:"cgroup_mib_per_sandbox"`
	MemAvailDropMiB float64 `json:"mem_available_drop_mib_per_sandbox"`
	DiskMiB         float64 `json:"disk_mib_per_sandbox"`
	// The host: its memory, what was available before, and how many idle
	// sandboxes fit in MemTotal - reserve at the measured MemAvailable
	// drop (memory) and in the data disk's free space (disk).
	MemTotalMiB float64 `json:"mem_total_mib"`
	MemAvailMiB float64 `json:"mem_available_before_mib"`
	ReserveMiB  float64 `json:"reserve_mib"`
	FitByMemory int     `json:"fit_by_memory"`
	FitByDisk   int     `json:"fit_by_disk"`
	PerGiB      float64 `json:"sandboxes_per_gib"`
	// IdleCPUShare is the host CPU their sentries and gofers use, all of
	// them idle (over 5 s); FitByIdleCPU how many idle ones would take the
	// whole host.
	IdleCPUShare float64 `json:"idle_cpu_percent_of_host"`
	FitByIdleCPU int     `json:"fit_by_idle_cpu"`
}

// RunDensity starts idle sandboxes one after another until Max, the memory
// reserve, or a failed start, then measures what they hold, and destroys
// them.
func RunDensity(ctx context.Context, o DensityOptions) (_ DensityReport, err error) {
	if o.Max <= 0 {
		o.Max = 200
	}
	if o.ReserveBytes <= 0 {
		o.ReserveBytes = 2 << 30
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	task := progress.Or(o.Progress).Start("bench density", progress.Steps, int64(o.Max))
	defer func() { task.Done(err) }()
	if o.Limits == (runtime.Limits{}) {
		// serve's defaults: memory is a ceiling, not a reservation.
		o.Limits = runtime.Limits{CPUs: 1, MemoryBytes: 1 << 30, Pids: 512, DiskBytes: 4 << 30}
	}
	rep := DensityReport{Rootfs: o.Rootfs, CPUs: goruntime.NumCPU(), ReserveMiB: mib(o.ReserveBytes)}
	if err := os.MkdirAll(o.StateDir, 0o700); err != nil {
		return rep, err
	}
	defer os.RemoveAll(o.StateDir)
	stateDir := filepath.Join(o.StateDir, "density")
	rt, err := gvisor.New(ctx, gvisor.Options{
		StateDir: stateDir, RunscPath: o.RunscPath, AgentPath: o.AgentPath, Platform: o.Platform,
		DefaultLimits: o.Limits, MaxSandboxes: o.Max, Logger: o.Logger,
	})
	if err != nil {
		return rep, err
	}
	defer rt.Close()
	rep.Platform, _ = rt.Platform()

	total, availBefore, err := meminfo()
	if err != nil {
		return rep, err
	}
	rep.MemTotalMiB, rep.MemAvailMiB = mib(total), mib(availBefore)
	diskBefore, err := freeBytes(o.StateDir)
	if err != nil {
		return rep, err
	}

	var (
		sbs   []runtime.Sandbox
		times []time.Duration
	)
	defer func() {
		for _, sb := range sbs {
			_ = sb.Destroy(context.WithoutCancel(ctx))
		}
	}()
	start := time.Now()
	rep.Stop = fmt.Sprintf("reached --max %d", o.Max)
	for i := range o.Max {
		if _, avail, err := meminfo(); err != nil {
			return rep, err
		} else if avail < o.ReserveBytes {
			rep.Stop = fmt.Sprintf("MemAvailable %d MiB reached the reserve of %d MiB", avail>>20, o.ReserveBytes>>20)
			break
		}
		t0 := time.Now()
		sb, err := rt.Create(ctx, runtime.Spec{ID: fmt.Sprintf("density-%d", i), BaseDir: o.Rootfs, BaseImage: "bench"})
		if err != nil {
			rep.Stop = fmt.Sprintf("start %d failed: %v", i+1, err)
			break
		}
		times = append(times, time.Since(t0))
		sbs = append(sbs, sb)
		task.Update(progress.State{Step: "starting idle sandboxes", Current: int64(i + 1)})
	}
	rep.StartAllMs = ms(time.Since(start))
	rep.Started = len(sbs)
	if len(sbs) == 0 {
		return rep, errors.New("density: no sandbox started: " + rep.Stop)
	}
	tenth := max(1, len(times)/10)
	rep.StartFirstTenth, rep.StartLastTenth = timing(times[:tenth]), timing(times[len(times)-tenth:])
	rep.Starts = samples(times)

	// Idle: let the sentries settle after boot, then read what they hold.
	task.Update(progress.State{Step: "measuring them idle", Current: int64(len(sbs))})
	time.Sleep(5 * time.Second)
	runscRoot := filepath.Join(stateDir, "runsc")
	cpu0, t0 := processCPU(runscRoot), time.Now()
	time.Sleep(5 * time.Second)
	if busy := processCPU(runscRoot) - cpu0; busy > 0 {
		rep.IdleCPUShare = round(100 * busy.Seconds() / (time.Since(t0).Seconds() * float64(rep.CPUs)))
	}
	n := float64(len(sbs))
	if rep.IdleCPUShare > 0 {
		rep.FitByIdleCPU = int(n * 100 / rep.IdleCPUShare)
	}
	rss, pss := processMemory(runscRoot)
	rep.RSSMiB, rep.PSSMiB = round(mib(rss)/n), round(mib(pss)/n)
	var cg int64
	for _, sb := range sbs {
		st, err := sb.Stats(ctx)
		if err != nil {
			continue
		}
		cg += st.MemoryBytes
		if _, err := sb.ListDir(ctx, "/"); err == nil {
			rep.Alive++
		}
	}
	var execs []time.Duration
	for _, sb := range sbs {
		t := time.Now()
		res, err := sb.Exec(ctx, runtime.ExecRequest{Cmd: []string{"true"}, Timeout: 10 * time.Second})
		d := time.Since(t)
		if err != nil || res.ExitCode != 0 {
			continue
		}
		execs = append(execs, d)
		if d <= time.Second {
			rep.ExecWithin1s++
		}
	}
	rep.Exec = timing(execs)
	rep.Exec.Samples = nil
	rep.CgroupMiB = round(mib(cg) / n)
	if _, availAfter, err := meminfo(); err == nil {
		rep.MemAvailDropMiB = round(mib(availBefore-availAfter) / n)
	}
	diskAfter, err := freeBytes(o.StateDir)
	if err != nil {
		return rep, err
	}
	used := diskBefore - diskAfter
	if blocks := allocated(stateDir); blocks > used {
		used = blocks // another writer on the disk may have freed space meanwhile
	}
	rep.DiskMiB = round(mib(used) / n)
	if rep.MemAvailDropMiB > 0 {
		rep.FitByMemory = int((rep.MemTotalMiB - rep.ReserveMiB) / rep.MemAvailDropMiB)
		rep.PerGiB = round(1024 / rep.MemAvailDropMiB)
	}
	if rep.DiskMiB > 0 {
		rep.FitByDisk = int(mib(diskBefore) / rep.DiskMiB)
	}
	return rep, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// meminfo reads MemTotal and MemAvailable in bytes.
func meminfo() (total, avail int64, err error) {
	total = statusKB("/proc/meminfo", "MemTotal:") << 10
	avail = statusKB("/proc/meminfo", "MemAvailable:") << 10
	if total == 0 || avail == 0 {
		return 0, 0, errors.New("read /proc/meminfo: no MemTotal or MemAvailable")
	}
	return total, avail, nil
}

// freeBytes is what unprivileged writers may still use on dir's disk.
func freeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// allocated sums the blocks the files under dir really hold (sandbox disks
// are sparse: their size says nothing).
func allocated(dir string) int64 {
	var sum int64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				sum += st.Blocks * 512
			}
		}
		return nil
	})
	return sum
}

// processCPU is the CPU time (user and system) of the processes runsc
// started with root: the sandboxes' sentries and gofers, nothing else of
// the host.
func processCPU(root string) time.Duration {
	var ticks int64
	for _, p := range runscProcs(root) {
		ticks += statTicks(filepath.Join(p, "stat"))
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// statTicks is utime + stime of a /proc/PID/stat (fields 14 and 15; the
// command in parentheses may hold spaces).
func statTicks(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // state is f[0]: field 3
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}
