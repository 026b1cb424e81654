package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/bench"
	"github.com/sandboxd/sandboxd/internal/kernel"
	"github.com/sandboxd/sandboxd/internal/runtime/busybox"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
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
	cmd.AddCommand(newKernelBuildCmd(g), newKernelLsCmd(g), newKernelBenchCmd(g))
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
			tracker, log := g.progress(cmd.ErrOrStderr(), asJSON)
			store := kernel.NewStore(g.cacheDir, log)
			k, err := store.Build(cmd.Context(), opts, tracker)
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

// newKernelBenchCmd measures microVMs booted with the cached kernel: cold
// boot, restore from a memory-snapshot template, exec, pause and resume, in
// one run, with the accelerator named.
func newKernelBenchCmd(g *globals) *cobra.Command {
	var (
		asJSON bool
		charts string
		opts   bench.MicroVMOptions
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure microVM sandboxes on this host: cold boot, snapshot restore, exec (needs root and QEMU)",
		Long: `bench starts real microVM sandboxes with the guest kernel from the cache and reports
cold boot to agent-ready, restore from a memory-snapshot template to agent-ready,
exec round trip, pause (memory to disk) and resume, fork of 5 from a running VM,
and QEMU's memory per idle VM, naming the accelerator (KVM, or TCG and why KVM was rejected). Times are
milliseconds. It runs on a small busybox root filesystem unless --rootfs is given.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			scratch, err := os.MkdirTemp("", "sandboxd-bench-microvm-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(scratch)
			if opts.Rootfs == "" {
				opts.Rootfs = filepath.Join(scratch, "rootfs")
				if err := busybox.BuildRootfs(opts.Rootfs); err != nil {
					return fmt.Errorf("build the busybox root filesystem: %w", err)
				}
			}
			if opts.AgentPath == "" {
				if opts.AgentPath, err = microvm.FindAgent(); err != nil {
					return err
				}
			}
			opts.StateDir = filepath.Join(scratch, "state")
			opts.CacheDir = g.cacheDir
			opts.Progress, opts.Logger = g.progress(cmd.ErrOrStderr(), asJSON)
			rep, err := bench.RunMicroVM(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if err := emit(cmd.OutOrStdout(), asJSON, rep, printMicroVMReport); err != nil {
				return err
			}
			return writeCharts(cmd.ErrOrStderr(), charts, rep)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.StringVar(&opts.Rootfs, "rootfs", "", "root filesystem to run (default: a busybox tree built for the run)")
	f.StringVar(&opts.AgentPath, "agent", "", "sandbox-agent binary (default: next to sandboxd, then PATH)")
	f.StringVar(&opts.KernelPath, "kernel", "", "guest vmlinux (default: the cached kernel)")
	f.StringVar(&opts.Accel, "accel", "", "kvm or tcg (default: probe)")
	f.IntVar(&opts.Iterations, "iterations", 5, "samples per timing")
	f.StringVar(&charts, "charts", "", chartsUsage)
	return cmd
}

func printMicroVMReport(w io.Writer, r bench.MicroVMReport) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "backend\t%s (accel %s, guest kernel %s, %d host CPUs, %d MiB sandboxes)\n", r.Backend, r.Accel, r.GuestKernel, r.CPUs, r.GuestMiB)
	if r.KVMRejected != "" {
		fmt.Fprintf(tw, "KVM rejected\t%s\n", r.KVMRejected)
	}
	row := func(name string, t bench.Timing) {
		fmt.Fprintf(tw, "%s\tp50 %.1f ms\tp90 %.1f ms\t(n=%d)\n", name, t.P50, t.P90, t.N)
	}
	row("cold boot to agent-ready", r.ColdBoot)
	row("template restore to agent-ready", r.TemplateRestore)
	row("exec true (agent)", r.ExecTrue)
	row("pause (memory to disk)", r.Pause)
	row("resume to agent-ready", r.Resume)
	row(fmt.Sprintf("fork of %d to agents ready", r.ForkCount), r.Fork)
	fmt.Fprintf(tw, "template build\t%.0f ms\n", r.TemplateBuildMs)
	fmt.Fprintf(tw, "idle VM memory\tQEMU RSS %.1f MiB\tsandbox processes %.1f MiB\n", r.IdleRSSMiB, r.IdleGuestMiB)
	tw.Flush()
}
