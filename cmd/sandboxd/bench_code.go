package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// newBenchCodeCmd is `sandboxd bench code`: the code interpreter through
// the API and E2B's protocol, next to the bare runtime driving the same
// kernel.
func newBenchCodeCmd(g *globals) *cobra.Command {
	var (
		asJSON          bool
		runsc, platform string
		n, creates      int
	)
	cmd := &cobra.Command{
		Use:   "code",
		Short: "Measure the code interpreter: create to first result, warm cells and charts (REST and E2B's runCode), next to the bare runtime",
		Long: `code starts a sandboxd server of its own on a scratch data dir (SQLite) serving the
code-interpreter template (built on first use) and times: --creates sandboxes each created
and then asked for '1 + 1' (the first result starts the kernel), through the REST API and as
E2B's code-interpreter SDK does (create code-interpreter-v1, then POST /execute on port
49999); then --n cells on a warm context ('x = 1') and --n matplotlib charts, each way. The
bare runtime, in the same run, in a runsc sandbox of the same root filesystem: runsc run,
then jupyter_client starting the same kernel over Unix sockets and the same cells, timed
inside the sandbox (no API, nothing leaves it).
Needs root, runsc and the sandbox-agent binary next to sandboxd.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, scratch, err := serverBenchScratch("sandboxd-code-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			tracker, log := g.progress(cmd.ErrOrStderr(), asJSON)
			template := image.CodeInterpreterTemplate
			rootfs, _, err := resolveRootfs(cmd.Context(), g, runtimeOptions{template: template}, cmd.ErrOrStderr(), log)
			if err != nil {
				return err
			}
			if runsc == "" {
				runsc = gvisor.DefaultRunsc()
			}
			rep, err := bench.RunCode(cmd.Context(), bench.CodeOptions{
				Sandboxd: self, ServeArgs: []string{"--template", template, "--runsc", runsc},
				Rootfs: rootfs, RunscPath: runsc, Platform: platform,
				StateDir: filepath.Join(scratch, "state"), Creates: creates, N: n, Progress: tracker,
			})
			if err != nil {
				return err
			}
			return emit(cmd.OutOrStdout(), asJSON, rep, printCode)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&runsc, "runsc", "", "runsc binary of the server and the baseline (default: "+gvisor.BundledRunsc+" when installed, else PATH)")
	f.StringVar(&platform, "gvisor-platform", "", "gVisor platform of the server and the baseline (default: the one serve probes)")
	f.IntVar(&n, "n", 30, "samples of each warm case")
	f.IntVar(&creates, "creates", 5, "sandboxes created for each create-to-first-result case")
	return cmd
}

func printCode(w io.Writer, r bench.CodeReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "code interpreter, ms (%s)\tp50\tp95\tmax\tok\n", r.Platform)
	for _, c := range r.Cases {
		l := c.Latency
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%d/%d\n", c.Name, l.P50, l.P95, l.Max, l.OK, l.N)
	}
	tw.Flush()
}
