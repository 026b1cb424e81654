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

// newBenchLifetimeCmd is `sandboxd bench lifetime`: a sandbox's pause and
// resume with its memory and with its files alone, through the API, next
// to the bare cost of the files' save and restore.
func newBenchLifetimeCmd(g *globals) *cobra.Command {
	var (
		asJSON          bool
		template        string
		runsc, platform string
		n, filesMiB     int
	)
	cmd := &cobra.Command{
		Use:   "lifetime",
		Short: "Measure pause and resume with the memory (on the node) and of the files alone (the blob store), next to the bare save of the files",
		Long: `lifetime starts a sandboxd server of its own on a scratch data dir (SQLite; its blob
store is that disk, as a single node's is) serving --template, creates a sandbox and --n times
has it write --files-mib MiB of new random bytes under /opt (not timed), then times a pause
and a resume of it, each from the request to the answer: POST /api/sandboxes/{id}/pause with its memory (runsc
checkpoint, kept on the node; resumed with runsc restore), then with {"memory": false} (its
files saved as a layer in the blob store, its runtime sandbox destroyed; resumed by a new
runtime sandbox from them: what lets any node of a cluster resume it). A command after each
resume checks the bytes are there. In the same run, the bare cost of the files' part: the
same bytes as a tar written to the disk and synced, then read back and synced.
Needs root, runsc and the sandbox-agent binary next to sandboxd.`,
		Example: "  sudo sandboxd bench lifetime\n  sudo sandboxd bench lifetime --files-mib 256 --n 3 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, scratch, err := serverBenchScratch("sandboxd-lifetime-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			tracker, _ := g.progress(cmd.ErrOrStderr(), asJSON)
			if runsc == "" {
				runsc = gvisor.DefaultRunsc()
			}
			rep, err := bench.RunLifetime(cmd.Context(), bench.LifetimeOptions{
				Sandboxd: self, ServeArgs: []string{"--template", template, "--runsc", runsc}, Platform: platform,
				StateDir: filepath.Join(scratch, "state"), N: n, FilesMiB: filesMiB, Progress: tracker,
			})
			if err != nil {
				return err
			}
			return emit(cmd.OutOrStdout(), asJSON, rep, printLifetime)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&template, "template", "base", "image template to serve")
	f.StringVar(&runsc, "runsc", "", "runsc binary of the server (default: "+gvisor.BundledRunsc+" when installed, else PATH)")
	f.StringVar(&platform, "gvisor-platform", "", "gVisor platform of the server (default: the one serve probes)")
	f.IntVar(&n, "n", 5, "pauses and resumes of each kind")
	f.IntVar(&filesMiB, "files-mib", 64, "MiB the sandbox writes before its pauses")
	return cmd
}

func printLifetime(w io.Writer, r bench.LifetimeReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%d MiB of files, ms (%s)\tpause p50\tp95\tresume p50\tp95\tok\n", r.FilesMiB, r.Platform)
	for _, c := range r.Cases {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t%d/%d\n", c.Name, c.Pause.P50, c.Pause.P95, c.Resume.P50, c.Resume.P95, c.Resume.OK, c.Resume.N)
	}
	tw.Flush()
}
