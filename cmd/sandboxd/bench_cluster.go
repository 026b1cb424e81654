package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/bench"
)

// newBenchClusterCmd is `sandboxd bench cluster`: the control plane of N
// nodes on one PostgreSQL, with simulated sandboxes.
func newBenchClusterCmd(g *globals) *cobra.Command {
	var (
		o       bench.ClusterOptions
		conc    []int
		asJSON  bool
		keepDir bool
		charts  string
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Measure the control plane of N nodes on one PostgreSQL with simulated sandboxes (--runtime fake)",
		Long: `cluster starts --nodes 'sandboxd serve' processes on the fake runtime (sandboxes that
exist in memory and run nothing: the control plane alone), on the PostgreSQL of
--database and the S3 store of --blob-store, each with its own data dir, ports and
cluster listener. It measures: the idle load (heartbeats) on PostgreSQL per node and
per heartbeat; --creates creates through the nodes in turn at each --concurrency
level (creates/s, latency p50/p99 — placement, the forward to the chosen node and the
rows, the runtime being free — statements and transactions per create, connections);
how the creates spread; an exec of 'true' in every sandbox through the node hosting
it and through another node (the routing's cost); a DELETE of each; then a node
SIGKILLed with sandboxes on it (the time until it is declared down and its sandboxes
failed). PostgreSQL statistics come from pg_stat_statements when the server preloads
it (the database's superuser resets it between phases), else from pg_stat_database.
Use a database of its own: the statistics are the whole database's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Database == "" || !strings.HasPrefix(o.Database, "postgres") {
				return flagErrorf("database", "bench cluster needs --database postgres://... (a database of its own)")
			}
			if !strings.HasPrefix(o.BlobStore, "s3://") {
				return flagErrorf("blob-store", "bench cluster needs --blob-store s3://... (cluster nodes share one)")
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			o.Sandboxd, o.Concurrency = self, conc
			scratch, err := os.MkdirTemp("", "sandboxd-cluster-")
			if err != nil {
				return err
			}
			if keepDir {
				fmt.Fprintf(cmd.ErrOrStderr(), "the nodes' data dirs stay under %s\n", scratch)
			} else {
				defer os.RemoveAll(scratch)
			}
			o.StateDir = filepath.Join(scratch, "nodes")
			_, o.Logger = g.progress(cmd.ErrOrStderr(), asJSON)
			rep, err := bench.RunCluster(cmd.Context(), o)
			if err != nil {
				return err
			}
			if err := emit(cmd.OutOrStdout(), asJSON, rep, printCluster); err != nil {
				return err
			}
			return writeCharts(cmd.ErrOrStderr(), charts, rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&charts, "charts", "", "also draw the figures as SVG charts into this directory (latencies by phase, statements per request and per idle node, cores used)")
	f.StringVar(&o.Database, "database", os.Getenv("SANDBOXD_DATABASE"), "postgres:// URL of the database the nodes share (one of the benchmark's own)")
	f.StringVar(&o.BlobStore, "blob-store", os.Getenv("SANDBOXD_BLOB_STORE"), "s3:// URL of the store the nodes share")
	f.IntVar(&o.Nodes, "nodes", 10, "node processes")
	f.IntVar(&o.Creates, "creates", 200, "creates at each concurrency level")
	f.IntSliceVar(&conc, "concurrency", []int{1, 8, 32}, "creates in flight, one pass per level")
	f.DurationVar(&o.Idle, "idle", 10*time.Second, "how long the idle load (heartbeats) is measured")
	f.DurationVar(&o.DownAfter, "node-down-after", 10*time.Second, "the nodes' --node-down-after")
	f.BoolVar(&o.Failure, "failure", true, "kill a node with sandboxes and time its detection (2 nodes or more)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&keepDir, "keep", false, "keep the nodes' data dirs and say where")
	return cmd
}

// printCluster writes the cluster report as tables.
func printCluster(w io.Writer, r bench.ClusterReport) {
	fmt.Fprintf(w, "bench cluster: %d nodes (runtime fake), %d CPUs, PostgreSQL stats from %s, node-down-after %s\n",
		r.Nodes, r.CPUs, r.PGStats, r.DownAfter)
	fmt.Fprintf(w, "nodes healthy and up in %.1fs; %.0f MiB RSS per idle node\n", r.StartSeconds, r.NodeRSSMiB)
	fmt.Fprintf(w, "idle (heartbeats, River's polling, collectors): %.1f statements/s per node; per heartbeat (every %.1fs): %.1f statements, %.1f transactions; %d connections (%.1f per node)\n",
		r.Heartbeat.StatementsPerNodeSec, r.Heartbeat.EverySeconds, r.Heartbeat.StatementsPerBeat, r.Heartbeat.XactsPerBeat, r.Idle.PG.MaxConns, r.Idle.PG.ConnsPerNode)
	fmt.Fprintf(w, "  of which membership (the nodes table) %.1f statements per heartbeat, River's job fetching %.1f statements/s per node\n",
		r.Heartbeat.MembershipPerBeat, r.Heartbeat.RiverPerNodeSec)
	fmt.Fprintf(w, "idle CPU: the nodes %.2f cores (%.3f a node), PostgreSQL %.2f cores\n\n", r.Idle.NodesCPU, r.Idle.NodesCPU/float64(max(1, r.Nodes)), r.Idle.PGCPU)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tin flight\tok/n\tper s\tp50 ms\tp99 ms\tstmts/op\tnet stmts/op\txacts/op\tmax conns\tnodes CPU\tPG CPU\t")
	row := func(p bench.ClusterPhase) {
		if p.Latency.N == 0 {
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%d/%d\t%.1f\t%.2f\t%.2f\t%.1f\t%.1f\t%.1f\t%d\t%.2f\t%.2f\t\n", p.Name, p.Concurrency, p.Latency.OK, p.Latency.N,
			p.PerSecond, p.Latency.P50, p.Latency.P99, p.PG.PerOp, p.PG.NetPerOp, p.PG.XactsPerOp, p.PG.MaxConns, p.NodesCPU, p.PGCPU)
	}
	for _, p := range r.Creates {
		row(p)
	}
	row(r.Direct)
	row(r.Routed)
	row(r.Stops)
	tw.Flush()
	for _, p := range append(append([]bench.ClusterPhase{}, r.Creates...), r.Direct, r.Routed, r.Stops) {
		if p.Errors > 0 {
			fmt.Fprintf(w, "%s (%d in flight): %d errors, the first: %s\n", p.Name, p.Concurrency, p.Errors, p.FirstError)
		}
	}
	fmt.Fprintf(w, "\nplacement: %d sandboxes on %d of %d nodes, %d to %d per node\n", r.Placement.Sandboxes, r.Placement.NodesUsed, r.Nodes, r.Placement.Min, r.Placement.Max)
	if r.Failure != nil {
		fmt.Fprintf(w, "failure: node SIGKILLed with %d sandboxes: declared down after %.1fs, its sandboxes failed after %.1fs\n",
			r.Failure.Sandboxes, r.Failure.DownSeconds, r.Failure.FailedSeconds)
	}
	top := func(title string, ss []bench.PGStatement) {
		if len(ss) == 0 {
			return
		}
		fmt.Fprintf(w, "\nmost frequent statements, %s:\n", title)
		for _, s := range ss {
			fmt.Fprintf(w, "  %7d calls %9.1f ms  %s\n", s.Calls, s.TotalMS, s.Query)
		}
	}
	top("idle", r.Idle.PG.Top)
	if len(r.Creates) > 0 {
		last := r.Creates[len(r.Creates)-1]
		top(fmt.Sprintf("creates at %d in flight", last.Concurrency), last.PG.Top)
	}
}
