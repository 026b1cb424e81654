package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/busybox"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// newBenchCmd measures the sandbox runtime on this host.
func newBenchCmd(g *globals) *cobra.Command {
	var (
		rf         runtimeBenchFlags
		iterations int
		concurrent int
		layerMiB   int
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox start, exec, memory, snapshot and restore on this host (needs root and runsc)",
		Long: `bench starts real sandboxes with the gVisor runtime and reports create-to-running
(cold and warm), exec round trip, 50 concurrent starts with host memory per idle
sandbox, snapshot and restore of a layer with 100 MiB changed, and the bare
'runsc run' of the same root filesystem as the baseline. Times are milliseconds
(p50/p90), sizes MiB. By default it runs on a small busybox root filesystem it
builds itself; --rootfs points it at another (e.g. a built base image).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			tracker, log := g.progress(cmd.ErrOrStderr(), rf.asJSON)
			scratch, err := os.MkdirTemp("", "sandboxd-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			if err := benchInputs(scratch, &rf.rootfs, &rf.agent); err != nil {
				return err
			}
			rep, err := bench.Run(ctx, bench.Options{
				Rootfs: rf.rootfs, StateDir: filepath.Join(scratch, "state"), AgentPath: rf.agent, RunscPath: rf.runsc, Platform: rf.platform,
				Iterations: iterations, Concurrent: concurrent, LayerMiB: layerMiB,
				Logger: log, Progress: tracker,
			})
			if err != nil {
				return err
			}
			return emitCharted(cmd, rf, rep, printReport)
		},
	}
	f := cmd.Flags()
	rf.register(f, "root filesystem to run (default: a busybox tree built for the run)")
	f.IntVar(&iterations, "iterations", 20, "samples per timing")
	f.IntVar(&concurrent, "concurrent", 50, "sandboxes started at once")
	f.IntVar(&layerMiB, "layer-mib", 100, "MiB changed before the snapshot")
	cmd.AddCommand(newBenchTTICmd(g), newBenchDensityCmd(g), newBenchWorkloadsCmd(g), newBenchPauseCmd(g), newBenchClusterCmd(g), newBenchExecCmd(g), newBenchCodeCmd(g), newBenchLifetimeCmd(g), newBenchVolumesCmd(g))
	return cmd
}

// newBenchDensityCmd is `sandboxd bench density`: how many idle sandboxes
// this host holds, and what one costs.
func newBenchDensityCmd(g *globals) *cobra.Command {
	var (
		rf               runtimeBenchFlags
		maxN, reserveMiB int
		memMiB, diskMiB  int
	)
	cmd := &cobra.Command{
		Use:   "density",
		Short: "Start idle sandboxes until a limit and report what one costs (memory, disk, CPU) and how many fit",
		Long: `density starts idle gVisor sandboxes one after another, with serve's default limits,
until --max (serve's default --node-capacity), the host's MemAvailable reaching
--reserve-mib, or a failed start. Then, idle, it reports per sandbox: RSS and PSS of
sentry and gofer, the memory cgroup, the drop of the host's MemAvailable and the data
disk's blocks; the host CPU they use idle; and how many would fit in this host's memory
(MemTotal - reserve, at the MemAvailable drop) and free disk. It checks they all answer,
then destroys them. Needs root, runsc and the sandbox-agent binary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scratch, err := os.MkdirTemp("", "sandboxd-density-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			if err := benchInputs(scratch, &rf.rootfs, &rf.agent); err != nil {
				return err
			}
			tracker, log := g.progress(cmd.ErrOrStderr(), rf.asJSON)
			rep, err := bench.RunDensity(cmd.Context(), bench.DensityOptions{
				Rootfs: rf.rootfs, StateDir: filepath.Join(scratch, "state"), AgentPath: rf.agent, RunscPath: rf.runsc,
				Platform: rf.platform, Max: maxN, ReserveBytes: int64(reserveMiB) << 20,
				Limits: runtime.Limits{CPUs: 1, MemoryBytes: int64(memMiB) << 20, Pids: 512, DiskBytes: int64(diskMiB) << 20},
				Logger: log, Progress: tracker,
			})
			if err != nil {
				return err
			}
			return emitCharted(cmd, rf, rep, printDensity)
		},
	}
	f := cmd.Flags()
	rf.register(f, "root filesystem to run (default: a busybox tree built for the run)")
	f.IntVar(&maxN, "max", 200, "most sandboxes started (serve's default --node-capacity)")
	f.IntVar(&reserveMiB, "reserve-mib", 2048, "stop before the host's MemAvailable falls below this")
	f.IntVar(&memMiB, "sandbox-memory-mib", 1024, "memory limit of each sandbox (a ceiling, not a reservation)")
	f.IntVar(&diskMiB, "sandbox-disk-mib", 4096, "disk limit of each sandbox (sparse)")
	return cmd
}

// newBenchTTICmd is `sandboxd bench tti`: create-to-first-command through
// the API, ComputeSDK's method, next to the bare runtime.
func newBenchTTICmd(g *globals) *cobra.Command {
	var (
		asJSON           bool
		chart, rootfs    string
		charts           string
		template, runsc  string
		platform         string
		n, burst, snapMB int
		diskMiB          int
		useBusybox       bool
		stagger, think   time.Duration
		custom           bool
		customImage      string
		templatePool     int
		runtimeName      string
	)
	cmd := &cobra.Command{
		Use:   "tti",
		Short: "Measure create-to-first-command through the API: sequential, staggered, burst and after a run, fresh and snapshot accounts",
		Long: `tti starts a sandboxd server of its own on a scratch data dir (SQLite), creates a fresh
account and one whose snapshot changed --snapshot-mib MiB, and for each measures the
time from POST /api/sandboxes to the first successful command through exec ('node -v'
on a template, 'echo ok' with --rootfs): --n creates one after another (sequential),
--n creates --stagger apart (staggered) and --burst at once (burst), then, once the warm pool
has grown to what that burst asked for (up to serve's --warm-pool-max), --burst at once again
(burst-again, the fresh account only); for the snapshot
account also its main flow (after-run): --n times a run that changes a file and ends
with a new snapshot, --think, then the create measured. Each mode of the fresh account
uses an account of its own. Every mode also reports the create's own answer
(create-to-running). Then the custom template case (unless --custom-template=false):
an OCI image of the served root filesystem (one uncompressed layer, served by a
registry of the benchmark's own on loopback; or --custom-image) is built into a
template through the API, and its account measures the sequential, staggered and
burst modes creating from it (the server keeps --template-pool sandboxes of custom
templates started ahead). The bare runtime's figures ('runsc run --detach' of a
busybox bundle, then 'runsc exec echo ok') are measured in the same run.
Times are milliseconds: p50, p95, p99 of the successful samples, and the success rate.
Needs root, runsc and the sandbox-agent binary next to sandboxd.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, scratch, err := serverBenchScratch("sandboxd-tti-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			baseRootfs := filepath.Join(scratch, "busybox")
			if err := busybox.BuildRootfs(baseRootfs); err != nil {
				return fmt.Errorf("build the busybox root filesystem: %w", err)
			}
			tracker, log := g.progress(cmd.ErrOrStderr(), asJSON)
			o := bench.TTIOptions{
				Sandboxd: self, N: n, Burst: burst, Stagger: stagger, Think: think, SnapshotMiB: snapMB,
				Rootfs: baseRootfs, RunscPath: runsc, Platform: platform,
				StateDir: filepath.Join(scratch, "state"), Progress: tracker,
			}
			if useBusybox {
				rootfs = baseRootfs
			}
			switch {
			case rootfs != "":
				o.ServeArgs = []string{"--rootfs", rootfs}
				o.Command = []string{"echo", "ok"}
			default:
				o.ServeArgs = []string{"--template", template}
				o.Command = []string{"node", "-v"}
			}
			// The server and the bare baseline run the same runsc.
			if runsc == "" {
				runsc = gvisor.DefaultRunsc()
			}
			o.RunscPath = runsc
			o.ServeArgs = append(o.ServeArgs, "--runsc", runsc)
			o.ServeArgs = append(o.ServeArgs, "--sandbox-disk-mib", strconv.Itoa(diskMiB))
			if runtimeName != "" {
				o.ServeArgs = append(o.ServeArgs, "--runtime", runtimeName)
			}
			if custom {
				// The image is the served root filesystem itself: the
				// same files as the built-in image (built now, as serve
				// would, when the cache lacks it).
				o.CustomImage, o.CustomRootfs = customImage, rootfs
				if o.CustomImage == "" && o.CustomRootfs == "" {
					if o.CustomRootfs, _, err = resolveRootfs(cmd.Context(), g, runtimeOptions{template: template}, cmd.ErrOrStderr(), log); err != nil {
						return err
					}
				}
				o.TemplatePool = strconv.Itoa(templatePool)
				o.ServeArgs = append(o.ServeArgs, "--templates-allow-private-registries", "--template-pool", o.TemplatePool)
			}
			rep, err := bench.RunTTI(cmd.Context(), o)
			if err != nil {
				return err
			}
			if chart != "" {
				f, err := os.Create(chart)
				if err != nil {
					return err
				}
				if err := bench.TTIChart(f, rep); err != nil {
					f.Close()
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			if err := emit(cmd.OutOrStdout(), asJSON, rep, printTTI); err != nil {
				return err
			}
			return writeCharts(cmd.ErrOrStderr(), charts, rep)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&chart, "chart", "", "also draw p50, p95 and p99 as one SVG bar chart into this file")
	f.StringVar(&charts, "charts", "", chartsUsage)
	f.StringVar(&rootfs, "rootfs", "", "serve this root filesystem (first command: echo ok) instead of a template")
	f.StringVar(&template, "template", "full", "image template to serve (first command: node -v)")
	f.BoolVar(&useBusybox, "busybox", false, "serve the baseline's busybox tree (first command: echo ok), the same root filesystem as the bare runtime")
	f.BoolVar(&custom, "custom-template", true, "also build a custom template (an image of the served root filesystem, from a registry on loopback) and measure creates from it")
	f.StringVar(&customImage, "custom-image", "", "build the custom template from this image reference instead (it must have the first command)")
	f.IntVar(&templatePool, "template-pool", 4, "the server's --template-pool: sandboxes of custom templates kept started ahead")
	f.IntVar(&diskMiB, "sandbox-disk-mib", 1024, "the server's --sandbox-disk-mib: its disk admission counts every sandbox at this size (the default 4096 admits about 15 on a 64 GiB disk, fewer than a burst)")
	f.StringVar(&runsc, "runsc", "", "runsc binary of the server and the baseline (default: "+gvisor.BundledRunsc+" when installed, else PATH)")
	f.StringVar(&platform, "gvisor-platform", "", "gVisor platform of the server and the baseline (default: the one serve probes)")
	f.StringVar(&runtimeName, "runtime", "", "the server's --runtime (default: serve's; with microvm, name the baseline's --gvisor-platform)")
	f.IntVar(&n, "n", 10, "samples of the sequential and staggered modes (and of the baseline)")
	f.IntVar(&burst, "burst", 20, "sandboxes created at once in the burst mode")
	f.IntVar(&snapMB, "snapshot-mib", 5, "MiB of random data the snapshot account's snapshot changed")
	f.DurationVar(&stagger, "stagger", 200*time.Millisecond, "gap between the staggered mode's creates")
	f.DurationVar(&think, "think", time.Second, "pause of the after-run mode between a run's end and the next create")
	return cmd
}

func printTTI(w io.Writer, r bench.TTIReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if t := r.Template; t != nil {
		fmt.Fprintf(w, "custom template: %s (%.0f MiB), built in %.1f s; server --template-pool %s\n", t.Image, t.ImageMiB, t.BuildMs/1000, t.Pool)
	}
	fmt.Fprintf(tw, "create → first successful `%s`, ms\tp50\tp95\tp99\tok\n", strings.Join(r.Command, " "))
	for _, res := range r.Results {
		l := res.Latency
		fmt.Fprintf(tw, "%s account, %s\t%.1f\t%.1f\t%.1f\t%d/%d\n", res.Account, res.Mode, l.P50, l.P95, l.P99, l.OK, l.N)
	}
	l := r.Baseline
	fmt.Fprintf(tw, "bare runsc run --detach + runsc exec (%s)\t%.1f\t%.1f\t%.1f\t%d/%d\n", r.Platform, l.P50, l.P95, l.P99, l.OK, l.N)
	l = r.BaselineBurst
	fmt.Fprintf(tw, "bare runsc run --detach + runsc exec, %d at once (%s)\t%.1f\t%.1f\t%.1f\t%d/%d\n", l.N, r.Platform, l.P50, l.P95, l.P99, l.OK, l.N)
	fmt.Fprintf(tw, "\t\t\t\t\n")
	fmt.Fprintf(tw, "create → running (the create's answer), ms\tp50\tp95\tp99\tok\n")
	for _, res := range r.Results {
		l := res.Create
		fmt.Fprintf(tw, "%s account, %s\t%.1f\t%.1f\t%.1f\t%d/%d\n", res.Account, res.Mode, l.P50, l.P95, l.P99, l.OK, l.N)
	}
	l = r.BaselineRun
	fmt.Fprintf(tw, "bare runsc run --detach (%s)\t%.1f\t%.1f\t%.1f\t%d/%d\n", r.Platform, l.P50, l.P95, l.P99, l.OK, l.N)
	tw.Flush()
	for _, res := range r.Results {
		for _, e := range res.Errors {
			fmt.Fprintf(w, "%s %s: %s\n", res.Account, res.Mode, e)
		}
	}
}

func printReport(w io.Writer, r bench.Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "backend\t%s (platform %s, %s, guest kernel %s, %d host CPUs)\n", r.Backend, r.Platform, r.Runsc, r.Kernel, r.CPUs)
	row := func(name string, t bench.Timing) {
		fmt.Fprintf(tw, "%s\tp50 %.1f ms\tp90 %.1f ms\t(n=%d)\n", name, t.P50, t.P90, t.N)
	}
	row("create, cold", r.CreateCold)
	row("create, warm pool", r.CreateWarm)
	row("exec true (agent)", r.ExecTrue)
	row("list / (agent round trip)", r.ListDir)
	row("exec true (runsc exec)", r.RunscExec)
	row("runsc run /bin/true (baseline)", r.Baseline.RunscRun)
	row("runsc run --detach (baseline)", r.Baseline.RunscDetachMs)
	fmt.Fprintf(tw, "cold / baseline\t%.2fx\twarm / baseline\t%.2fx\n", r.Baseline.ColdRatio, r.Baseline.WarmRatio)
	c := r.Concurrent
	fmt.Fprintf(tw, "%d concurrent starts\tall running in %.0f ms\teach p50 %.0f ms, p90 %.0f ms\n", c.N, c.TotalMs, c.Each.P50, c.Each.P90)
	fmt.Fprintf(tw, "idle sandbox memory\tRSS %.1f MiB\tPSS %.1f MiB\tcgroup %.1f MiB\n", c.IdleRSSMiB, c.IdlePSSMiB, c.IdleCgroupMB)
	s := r.Snapshot
	fmt.Fprintf(tw, "snapshot of %d MiB changed\tquiesce %.0f ms, then snapshot %.0f ms\tlayer %.1f MiB\n", s.ChangedMiB, s.QuiesceMs, s.SnapshotMs, s.LayerMiB)
	fmt.Fprintf(tw, "restore\tcreate %.0f ms\tunpack alone %.0f ms\tidentical %v\n", s.RestoreMs, s.ApplyMs, s.VerifiedSame)
	tw.Flush()
}

func printDensity(w io.Writer, r bench.DensityReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "host\t%d CPUs, %.0f MiB memory (%.0f available before), gVisor %s\n", r.CPUs, r.MemTotalMiB, r.MemAvailMiB, r.Platform)
	fmt.Fprintf(tw, "idle sandboxes started\t%d (%d answering), stopped by: %s\n", r.Started, r.Alive, r.Stop)
	fmt.Fprintf(tw, "an exec of true in each, one after another, all idle\tp50 %.1f ms, p90 %.1f, max %.1f; %d of %d within 1 s\n", r.Exec.P50, r.Exec.P90, r.Exec.Max, r.ExecWithin1s, r.Started)
	fmt.Fprintf(tw, "time to start them\t%.1f s; one start p50 %.0f ms in the first tenth, %.0f ms in the last\n", r.StartAllMs/1000, r.StartFirstTenth.P50, r.StartLastTenth.P50)
	fmt.Fprintf(tw, "per idle sandbox\tMemAvailable drop %.1f MiB, cgroup %.1f MiB, PSS %.1f MiB, RSS %.1f MiB, disk %.1f MiB\n", r.MemAvailDropMiB, r.CgroupMiB, r.PSSMiB, r.RSSMiB, r.DiskMiB)
	fmt.Fprintf(tw, "idle CPU, all of them\t%.1f%% of the host (their sentries and gofers): %.3f%% of a CPU each\n", r.IdleCPUShare, r.IdleCPUShare*float64(r.CPUs)/float64(max(r.Started, 1)))
	fmt.Fprintf(tw, "fit on this host\t%d by memory (%.1f per GiB, %.0f MiB kept), %d by idle CPU (the whole host), %d by free disk\n", r.FitByMemory, r.PerGiB, r.ReserveMiB, r.FitByIdleCPU, r.FitByDisk)
	tw.Flush()
}

// newBenchPauseCmd is `sandboxd bench pause`: pause, resume and fork with
// memory on gVisor, next to bare runsc checkpoint and restore.
func newBenchPauseCmd(g *globals) *cobra.Command {
	var (
		rf                       runtimeBenchFlags
		iterations, touch, forkN int
	)
	cmd := &cobra.Command{
		Use:   "pause",
		Short: "Measure pause, resume and fork with memory (gVisor), idle and with memory touched, next to bare runsc checkpoint/restore",
		Long: `pause starts a gVisor sandbox and times Pause (memory and processes saved, host processes
ended) and Resume (until its agent answers) --iterations times, then Fork of --fork children
(until every child's agent answers); first idle, then holding --touch-mib MiB of random
bytes in its memory (a file in its /run tmpfs). The baseline, in the same run, is the bare
'runsc checkpoint' and 'runsc restore --detach' of an idle container of the same root
filesystem. Times are milliseconds (p50/p90). Needs root, runsc and the sandbox-agent binary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scratch, err := os.MkdirTemp("", "sandboxd-pause-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			if err := benchInputs(scratch, &rf.rootfs, &rf.agent); err != nil {
				return err
			}
			tracker, log := g.progress(cmd.ErrOrStderr(), rf.asJSON)
			rep, err := bench.RunPause(cmd.Context(), bench.PauseOptions{
				Rootfs: rf.rootfs, StateDir: filepath.Join(scratch, "state"), AgentPath: rf.agent, RunscPath: rf.runsc,
				Platform: rf.platform, Iterations: iterations, TouchMiB: touch, ForkCount: forkN,
				Logger: log, Progress: tracker,
			})
			if err != nil {
				return err
			}
			return emitCharted(cmd, rf, rep, printPause)
		},
	}
	f := cmd.Flags()
	rf.register(f, "root filesystem to run (default: a busybox tree built for the run)")
	f.IntVar(&iterations, "iterations", 5, "samples per timing (forks: half as many)")
	f.IntVar(&touch, "touch-mib", 256, "MiB of random bytes the touched sandbox holds in memory")
	f.IntVar(&forkN, "fork", 5, "children per fork")
	return cmd
}

func printPause(w io.Writer, r bench.PauseReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "host\t%d CPUs, %s %s, %s\n", r.CPUs, r.Backend, r.Platform, r.Runsc)
	fmt.Fprintln(tw, "ms (p50 / p90)\tidle\t"+fmt.Sprintf("%d MiB touched", r.TouchMiB))
	row := func(name string, a, b bench.Timing) {
		fmt.Fprintf(tw, "%s\t%.0f / %.0f\t%.0f / %.0f\n", name, a.P50, a.P90, b.P50, b.P90)
	}
	row("pause", r.PauseIdle, r.PauseTouched)
	row("resume", r.ResumeIdle, r.ResumeTouched)
	row(fmt.Sprintf("fork of %d", r.ForkCount), r.ForkIdle, r.ForkTouched)
	row(fmt.Sprintf("a cluster's pause: its state to the blob store, after the pause (%d / %d MiB stored)", r.StateBytes[0]>>20, r.StateBytes[1]>>20), r.SaveIdle, r.SaveTouched)
	row("its restore on another node from the blob store", r.RestoreIdle, r.RestoreTouched)
	fmt.Fprintf(tw, "bare runsc, idle container\tcheckpoint %.0f / %.0f, restore %.0f / %.0f\t\n",
		r.Baseline.Checkpoint.P50, r.Baseline.Checkpoint.P90, r.Baseline.Restore.P50, r.Baseline.Restore.P90)
	tw.Flush()
}

// serverBenchScratch is what a benchmark that starts a server of its own
// needs: this binary (the server) and a scratch directory, which the
// caller removes. Keep prefix short: sockets live under it.
func serverBenchScratch(prefix string) (self, scratch string, err error) {
	if self, err = os.Executable(); err != nil {
		return "", "", err
	}
	scratch, err = os.MkdirTemp("", prefix)
	return self, scratch, err
}

// benchInputs fills an empty rootfs with a busybox tree built in scratch
// and an empty agent with the sandbox-agent binary found beside sandboxd.
func benchInputs(scratch string, rootfs, agent *string) error {
	if *rootfs == "" {
		*rootfs = filepath.Join(scratch, "rootfs")
		if err := busybox.BuildRootfs(*rootfs); err != nil {
			return fmt.Errorf("build the busybox root filesystem: %w", err)
		}
	}
	if *agent == "" {
		a, err := gvisor.FindAgent()
		if err != nil {
			return err
		}
		*agent = a
	}
	return nil
}

// chartsUsage says what --charts does.
const chartsUsage = "also draw the figures as SVG charts into this directory (latency distributions, the bare runtime's beside sandboxd's)"

// charter is a report that has charts.
type charter interface{ Charts() []bench.Chart }

// writeCharts draws a report's charts into dir, when set, and names the
// files on w (stderr: stdout has the figures).
func writeCharts(w io.Writer, dir string, rep charter) error {
	if dir == "" {
		return nil
	}
	paths, err := bench.WriteCharts(dir, rep.Charts())
	for _, p := range paths {
		fmt.Fprintln(w, "chart:", p)
	}
	return err
}

// emitCharted prints a report as --json asks, then draws its --charts:
// the figures are printed even when a chart cannot be written.
func emitCharted[R charter](cmd *cobra.Command, rf runtimeBenchFlags, rep R, print func(io.Writer, R)) error {
	if err := emit(cmd.OutOrStdout(), rf.asJSON, rep, print); err != nil {
		return err
	}
	return writeCharts(cmd.ErrOrStderr(), rf.charts, rep)
}

// emit writes a benchmark's report as indented JSON, or as print renders it.
func emit[R any](w io.Writer, asJSON bool, rep R, print func(io.Writer, R)) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	print(w, rep)
	return nil
}

// newBenchWorkloadsCmd is `sandboxd bench workloads`: syscall-heavy work
// inside a sandbox, to compare gVisor platforms and runsc versions.
func newBenchWorkloadsCmd(g *globals) *cobra.Command {
	var (
		rf          runtimeBenchFlags
		runs, files int
	)
	cmd := &cobra.Command{
		Use:   "workloads",
		Short: "Time syscall-heavy work inside one sandbox of the full image: git status, a Python import, node startup, npm ci",
		Long: `workloads starts one gVisor sandbox of --rootfs (the full image's root filesystem: it needs
git, python3, node and npm) and, after an untimed setup and an untimed first round, times
inside the sandbox --runs times each: 'git status' in a repository of --files committed
files, 'python3 -c "import json, email, http.client"', 'node -e 0', and 'npm ci --offline'
of a project of up to 60 packages (packed from the image's global node_modules into
vendor/ and locked offline: no registry is reached). Times are milliseconds.
Needs root, runsc and the sandbox-agent binary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scratch, err := os.MkdirTemp("", "sandboxd-workloads-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			if rf.rootfs == "" {
				return errors.New("--rootfs is required: the full image's root filesystem")
			}
			if err := benchInputs(scratch, &rf.rootfs, &rf.agent); err != nil {
				return err
			}
			tracker, log := g.progress(cmd.ErrOrStderr(), rf.asJSON)
			rep, err := bench.RunWorkloads(cmd.Context(), bench.WorkloadOptions{
				Rootfs: rf.rootfs, StateDir: filepath.Join(scratch, "state"), AgentPath: rf.agent, RunscPath: rf.runsc,
				Platform: rf.platform, Runs: runs, Files: files,
				Logger: log, Progress: tracker,
			})
			if err != nil {
				return err
			}
			return emitCharted(cmd, rf, rep, printWorkloads)
		},
	}
	f := cmd.Flags()
	rf.register(f, "root filesystem of the full image (required), e.g. ~/.cache/sandboxd/images/full-*/rootfs")
	f.IntVar(&runs, "runs", 5, "timed runs of each workload")
	f.IntVar(&files, "files", 10000, "files in the git repository")
	return cmd
}

func printWorkloads(w io.Writer, rep bench.WorkloadReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "gVisor %s, %s; %d npm packages; setup %.1f s\tp50\tp90\tmin\tmax\n", rep.Platform, rep.Runsc, rep.Packages, rep.SetupMs/1000)
	names := make([]string, 0, len(rep.Results))
	for k := range rep.Results {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		t := rep.Results[k]
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\n", k, t.P50, t.P90, t.Min, t.Max)
	}
	tw.Flush()
}

// runtimeBenchFlags are the flags of the benchmarks that drive the gVisor
// runtime directly (bench, bench density, bench workloads).
type runtimeBenchFlags struct {
	asJSON                         bool
	rootfs, agent, runsc, platform string
	charts                         string
}

// register adds the flags to f; rootfsUsage says what --rootfs is for.
func (r *runtimeBenchFlags) register(f *pflag.FlagSet, rootfsUsage string) {
	f.BoolVar(&r.asJSON, "json", false, "print one JSON object")
	f.StringVar(&r.rootfs, "rootfs", "", rootfsUsage)
	f.StringVar(&r.agent, "agent", "", "sandbox-agent binary (default: next to sandboxd, then PATH)")
	f.StringVar(&r.runsc, "runsc", "", "runsc binary (default: the one serve chooses)")
	f.StringVar(&r.platform, "gvisor-platform", "", "gVisor platform (default: probed, as serve)")
	f.StringVar(&r.charts, "charts", "", chartsUsage)
}
