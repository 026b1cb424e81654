package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/kernel"
)

// newKernelCmd is `sandboxd kernel`: the minimal guest kernel microVM
// sandboxes boot, built from Debian's linux-source package and cached in
// <cache-dir>/kernels.
func newKernelCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kernel",
		Short: "Build and list the guest kernel of microVM sandboxes",
		Long: "The microvm runtime boots a minimal Linux kernel configured for QEMU's microvm\n" +
			"machine (virtio-mmio, no PCI, no ACPI, no modules). It is built from Debian's\n" +
			"linux-source package with the configuration fragment kept in sandboxd's source\n" +
			"and cached in <cache-dir>/kernels, keyed by the fragment and the source version.\n" +
			"Needs: apt-get install linux-source-6.1 build-essential bc bison flex libelf-dev libssl-dev",
	}
	cmd.AddCommand(newKernelBuildCmd(g), newKernelLsCmd(g))
	return cmd
}

func newKernelBuildCmd(g *globals) *cobra.Command {
	var (
		opts   kernel.BuildOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "build",
		Short: "Build the guest kernel unless it is cached",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store := kernel.NewStore(g.cacheDir, g.logger(cmd.ErrOrStderr()))
			k, err := store.Build(cmd.Context(), opts, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(k)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s, %s, built in %s\n%s\n", k.ID, k.Release,
				humanize.IBytes(uint64(k.Size)), k.BuildDuration.Round(time.Second), k.Path)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Source, "source", "", "linux-source tarball (default: the newest /usr/src/linux-source-*.tar.xz)")
	f.IntVar(&opts.Jobs, "jobs", 0, "parallel compile jobs (default: the number of CPUs)")
	f.BoolVar(&opts.Force, "force", false, "rebuild even if the kernel is cached")
	f.BoolVar(&asJSON, "json", false, "print the built kernel as JSON")
	return cmd
}

func newKernelLsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the kernels in the cache",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store := kernel.NewStore(g.cacheDir, g.logger(cmd.ErrOrStderr()))
			list, err := store.List()
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tRELEASE\tSIZE\tBUILT\tBUILD TIME")
			for _, k := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Release, humanize.IBytes(uint64(k.Size)),
					k.CreatedAt.Local().Format(time.DateTime), k.BuildDuration.Round(time.Second))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
