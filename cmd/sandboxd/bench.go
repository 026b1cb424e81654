package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/runtime/busybox"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// newBenchCmd measures the sandbox runtime on this host.
func newBenchCmd(g *globals) *cobra.Command {
	var (
		asJSON     bool
		rootfs     string
		agent      string
		runsc      string
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
			log := g.logger(cmd.ErrOrStderr())
			scratch, err := os.MkdirTemp("", "sandboxd-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			if rootfs == "" {
				rootfs = filepath.Join(scratch, "rootfs")
				if err := busybox.BuildRootfs(rootfs); err != nil {
					return fmt.Errorf("build the busybox root filesystem: %w", err)
				}
			}
			if agent == "" {
				if agent, err = gvisor.FindAgent(); err != nil {
					return err
				}
			}
			rep, err := bench.Run(ctx, bench.Options{
				Rootfs: rootfs, StateDir: filepath.Join(scratch, "state"), AgentPath: agent, RunscPath: runsc,
				Iterations: iterations, Concurrent: concurrent, LayerMiB: layerMiB,
				Logger: log, Progress: cmd.ErrOrStderr(),
			})
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			printReport(cmd.OutOrStdout(), rep)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&rootfs, "rootfs", "", "root filesystem to run (default: a busybox tree built for the run)")
	f.StringVar(&agent, "agent", "", "sandbox-agent binary (default: next to sandboxd, then PATH)")
	f.StringVar(&runsc, "runsc", "", "runsc binary (default: PATH)")
	f.IntVar(&iterations, "iterations", 20, "samples per timing")
	f.IntVar(&concurrent, "concurrent", 50, "sandboxes started at once")
	f.IntVar(&layerMiB, "layer-mib", 100, "MiB changed before the snapshot")
	return cmd
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
