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

// newBenchVolumesCmd is `sandboxd bench volumes`: a create with a volume
// next to one without, and a volume's sync to the blob store and fetch
// from it, next to the bare copy of its bytes.
func newBenchVolumesCmd(g *globals) *cobra.Command {
	var (
		asJSON              bool
		template            string
		runsc, platform     string
		n, sizeMiB, fillMiB int
	)
	cmd := &cobra.Command{
		Use:   "volumes",
		Short: "Measure a create with a volume (on the node) and a volume's sync to and fetch from the blob store, next to the bare copy",
		Long: `volumes starts a sandboxd server of its own on a scratch data dir (SQLite; one node)
serving --template, creates a volume of --size-mib MiB and has a sandbox write --fill-mib MiB
of random bytes in it (not timed), then times --n creates of a sandbox with the volume
mounted read-write (its image on the node's disk: the attach of a single node) and --n
without, each from the request to the answer; the server starts no sandbox ahead (a
create with a volume never takes one), so both are cold starts. Then it moves the same image between two
nodes of a cluster as sandboxd does, with the volumes package itself on a database and a blob
store of its own on the same disk: the sync of a writer's end (the image's data extents,
zstd-compressed, into the blob store) and the fetch of a sandbox's start on the other node
(downloaded, checked and written sparse). In a cluster S3's transfer adds to both. In the
same run, the bare cost: the image's data extents copied to a file and synced.
Needs root, runsc and the sandbox-agent binary next to sandboxd.`,
		Example: "  sudo sandboxd bench volumes\n  sudo sandboxd bench volumes --size-mib 1024 --fill-mib 512 --n 3 --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, scratch, err := serverBenchScratch("sandboxd-volumes-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			tracker, _ := g.progress(cmd.ErrOrStderr(), asJSON)
			if runsc == "" {
				runsc = gvisor.DefaultRunsc()
			}
			rep, err := bench.RunVolumes(cmd.Context(), bench.VolumesOptions{
				// No sandboxes started ahead: a create with a volume is
				// always cold, and so is the one it is set beside.
				Sandboxd: self, ServeArgs: []string{"--template", template, "--runsc", runsc, "--warm-pool", "0", "--warm-pool-max", "0", "--prewarm", "0"}, Platform: platform,
				StateDir: filepath.Join(scratch, "state"), N: n, SizeMiB: sizeMiB, FillMiB: fillMiB, Progress: tracker,
			})
			if err != nil {
				return err
			}
			return emit(cmd.OutOrStdout(), asJSON, rep, printVolumesBench)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&template, "template", "base", "image template to serve")
	f.StringVar(&runsc, "runsc", "", "runsc binary of the server (default: "+gvisor.BundledRunsc+" when installed, else PATH)")
	f.StringVar(&platform, "gvisor-platform", "", "gVisor platform of the server (default: the one serve probes)")
	f.IntVar(&n, "n", 5, "creates, syncs and fetches of each kind")
	f.IntVar(&sizeMiB, "size-mib", 1024, "the volume's size")
	f.IntVar(&fillMiB, "fill-mib", 900, "MiB of random bytes written in the volume first")
	return cmd
}

func printVolumesBench(w io.Writer, r bench.VolumesReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "a %d MiB volume holding %d MiB, ms (%s; its copy %d MiB)\tp50\tp95\tok\n", r.SizeMiB, r.FillMiB, r.Platform, r.CopyBytes>>20)
	for _, c := range r.Cases {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%d/%d\n", c.Name, c.Latency.P50, c.Latency.P95, c.Latency.OK, c.Latency.N)
	}
	tw.Flush()
}
