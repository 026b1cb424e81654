package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/store"
)

// newAdminNodeCmd is `sandboxd admin node ls|cordon|uncordon|drain`: the
// nodes sharing the database, with their load, and the operator's say on
// which take new sandboxes.
func newAdminNodeCmd(g *globals) *cobra.Command {
	node := &cobra.Command{Use: "node", Short: "List the nodes of a cluster with their load; cordon, uncordon and drain them"}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the nodes: state, schedule, sandboxes against capacity, last heartbeat",
		Args:  cobra.NoArgs,
		RunE: g.withStore(func(cmd *cobra.Command, _ []string, st *store.Store) error {
			nodes, err := st.ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			loads, err := st.NodeLoads(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				type row struct {
					store.Node
					Sandboxes int `json:"sandboxes"`
				}
				rows := make([]row, 0, len(nodes))
				for _, n := range nodes {
					rows = append(rows, row{n, loads[n.ID]})
				}
				return printJSON(cmd.OutOrStdout(), rows)
			}
			return printNodes(cmd.OutOrStdout(), nodes, loads, time.Now())
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	schedule := func(use, short, to string) *cobra.Command {
		return &cobra.Command{
			Use:   use + " NODE_ID",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: g.withStore(func(cmd *cobra.Command, args []string, st *store.Store) error {
				if err := st.SetNodeSchedule(cmd.Context(), args[0], to); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s: %s\n", args[0], use+"ed")
				return nil
			}),
		}
	}
	node.AddCommand(ls,
		schedule("cordon", "Take no new sandboxes on the node; those it has run on", store.NodeCordoned),
		schedule("uncordon", "Take new sandboxes on the node again", ""),
		schedule("drain", "Take no new sandboxes on the node and stop those it has (within its heartbeat interval)", store.NodeDraining),
	)
	return node
}

func printNodes(w io.Writer, nodes []store.Node, loads map[string]int, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tHOSTNAME\tADDRESS\tSTATUS\tSCHEDULE\tSANDBOXES\tCPUS\tMEMORY\tRUNTIME\tHEARTBEAT\tVERSION")
	for _, n := range nodes {
		schedule := n.Schedule
		if schedule == "" {
			schedule = "-"
		}
		max := "∞"
		if n.Capacity.MaxSandboxes > 0 {
			max = fmt.Sprint(n.Capacity.MaxSandboxes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d/%s\t%d\t%.1f GiB\t%s\t%s ago\t%s\n", n.ID, n.Hostname, n.Address, n.Status, schedule,
			loads[n.ID], max, n.Capacity.CPUs, float64(n.Capacity.MemoryBytes)/(1<<30), n.Capacity.Runtime,
			now.Sub(n.HeartbeatAt).Round(time.Second), n.Version)
	}
	return tw.Flush()
}
