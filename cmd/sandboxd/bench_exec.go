package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// newBenchExecCmd is `sandboxd bench exec`: commands and output through the
// API in a running sandbox, next to the bare runtime doing the same.
func newBenchExecCmd(g *globals) *cobra.Command {
	var (
		asJSON           bool
		charts, template string
		runsc, platform  string
		n, streamMiB     int
	)
	cmd := &cobra.Command{
		Use:   "exec",
		Short: "Measure exec latency (REST and E2B's commands.run) and output streaming in a running sandbox, next to the bare runtime",
		Long: `exec starts a sandboxd server of its own on a scratch data dir (SQLite) serving --template,
creates one sandbox through E2B's API and times, one after another on a kept-alive
connection (--n samples each, after 5 not counted): POST /api/sandboxes/{id}/exec of
'true', of a command not found (an agent round trip that starts nothing) and of
'bash -l -c true'; E2B's process.Start (what the e2b SDK's commands.run sends: a login
bash) and of 'true'. Then the output of 'cat' of a --stream-mib MiB text file streamed as
Server-Sent Events, in MB/s (10^6 bytes). The bare runtime, in the same run, in a sandbox
of the same root filesystem: 'runsc exec /bin/true', one start of /bin/true by bash inside
it (fork, exec and wait, timed by bash's own clock: what starting any process costs in
gVisor) and 'runsc exec cat' of the same file into a host pipe.
Needs root, runsc and the sandbox-agent binary next to sandboxd.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, scratch, err := serverBenchScratch("sandboxd-exec-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			tracker, log := g.progress(cmd.ErrOrStderr(), asJSON)
			rootfs, _, err := resolveRootfs(cmd.Context(), g, runtimeOptions{template: template}, cmd.ErrOrStderr(), log)
			if err != nil {
				return err
			}
			// The server and the bare baseline run the same runsc.
			if runsc == "" {
				runsc = gvisor.DefaultRunsc()
			}
			rep, err := bench.RunExec(cmd.Context(), bench.ExecOptions{
				Sandboxd: self, ServeArgs: []string{"--template", template, "--runsc", runsc},
				Rootfs: rootfs, RunscPath: runsc, Platform: platform,
				StateDir: filepath.Join(scratch, "state"), N: n, StreamMiB: streamMiB, Progress: tracker,
			})
			if err != nil {
				return err
			}
			if err := emit(cmd.OutOrStdout(), asJSON, rep, printExec); err != nil {
				return err
			}
			return writeCharts(cmd.ErrOrStderr(), charts, rep)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&charts, "charts", "", chartsUsage)
	f.StringVar(&template, "template", "base", "image template to serve; the bare runtime runs its root filesystem (it needs bash and cat)")
	f.StringVar(&runsc, "runsc", "", "runsc binary of the server and the baseline (default: "+gvisor.BundledRunsc+" when installed, else PATH)")
	f.StringVar(&platform, "gvisor-platform", "", "gVisor platform of the server and the baseline (default: the one serve probes)")
	f.IntVar(&n, "n", 50, "samples of each latency")
	f.IntVar(&streamMiB, "stream-mib", 256, "MiB of output streamed")
	return cmd
}

func printExec(w io.Writer, r bench.ExecReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "one after another, ms (%s)\tp50\tp95\tp99\tok\n", r.Platform)
	for _, c := range r.Cases {
		l := c.Latency
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%d/%d\n", c.Name, l.P50, l.P95, l.P99, l.OK, l.N)
	}
	fmt.Fprintf(tw, "\t\t\t\t\n")
	fmt.Fprintf(tw, "output streamed\tMB/s\tMiB\ts\t\n")
	for _, s := range r.Streams {
		fmt.Fprintf(tw, "%s\t%.0f\t%d\t%.2f\t\n", s.Name, s.MBPerSec, s.Bytes>>20, s.Seconds)
	}
	tw.Flush()
}
