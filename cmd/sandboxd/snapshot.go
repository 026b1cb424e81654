package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// Named snapshots (docs/TEMPLATES.md, "Named snapshots"): `sandboxd sandbox
// snapshot ID [--name N]` saves one; `sandboxd snapshot ls|inspect|rm|
// template` reads and manages them; `sandboxd sandbox create --snapshot N`
// starts from one.

// sandboxSnapshotCommand is `sandboxd sandbox snapshot SANDBOX_ID [--name
// NAME[:TAG]]`: POST /api/sandboxes/{id}/snapshots.
func sandboxSnapshotCommand(g *globals, c *apiClient, f *clientFlags) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "snapshot SANDBOX_ID [--name NAME[:TAG]]",
		Short: "Save a running sandbox's files as a named snapshot that new sandboxes start from",
		Long: "Save a running sandbox's files (not its memory or processes: `sandbox pause` keeps those) as a named\n" +
			"snapshot of its account, answered once it is ready. `sandbox create --snapshot NAME` starts new sandboxes\n" +
			"from it, any number, on any node. Saving a name again replaces that snapshot (sandboxes already started\n" +
			"from the old one keep it). Without --name the snapshot is named by its id. The sandbox runs on.",
		Example: "  sandboxd sandbox snapshot sbx_123 --name deps-installed\n" +
			"  sandboxd sandbox snapshot --json sbx_123 --name work:v2",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			body := client.CreateSnapshotRequest{Name: optional(name), AccountID: optional(f.account)}
			waits := g.waitTracker(cmd.ErrOrStderr(), f.asJSON)
			out, err := waitFor(waits, "saving "+args[0], func() (*client.NamedSnapshotResponse, error) {
				res, err := client.Check(cl.PostSandboxesIDSnapshotsWithResponse(cmd.Context(), args[0], body))
				if err != nil {
					return nil, err
				}
				return decoded(res.JSON200)
			})
			if err != nil {
				return err
			}
			return printSnapshots(cmd.OutOrStdout(), []client.NamedSnapshot{out.Snapshot}, f.asJSON, true)
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "NAME[:TAG] of the snapshot (tag latest); default: its id")
	return cmd
}

// newSnapshotCmd is `sandboxd snapshot ls|inspect|rm|template`.
func newSnapshotCmd() *cobra.Command {
	c := &apiClient{http: newAPIHTTPClient()}
	f := &clientFlags{}
	cmd := &cobra.Command{Use: "snapshot", Short: "List, inspect, delete and promote named snapshots of sandboxes' files"}
	registerAPIFlags(cmd, c, f, true)

	var sandboxID string
	ls := &cobra.Command{
		Use:   "ls [--sandbox SANDBOX_ID]",
		Short: "List the account's named snapshots, newest first",
		Long: "List the account's named snapshots (`sandbox snapshot` saves them), newest first: each with its id,\n" +
			"NAME:TAG and the sandbox it was taken of. --json prints the API's objects.",
		Example: "  sandboxd snapshot ls\n" +
			"  sandboxd snapshot ls --sandbox sbx_123 --json | jq -r '.[].ref'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			limit := 100
			res, err := client.Check(cl.GetSnapshotsWithResponse(cmd.Context(), &client.GetSnapshotsParams{
				AccountID: optional(f.account), SandboxID: optional(sandboxID), Limit: &limit}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			return printSnapshots(cmd.OutOrStdout(), out.Named, f.asJSON, false)
		},
	}
	ls.Flags().StringVar(&sandboxID, "sandbox", "", "only the snapshots taken of this sandbox")

	inspect := &cobra.Command{
		Use:     "inspect NAME[:TAG]|ID",
		Aliases: []string{"get"},
		Short:   "Show one named snapshot",
		Example: "  sandboxd snapshot inspect deps-installed\n" +
			"  sandboxd snapshot get --json tpl_123",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := c.snapshot(cmd.Context(), args[0], f.account)
			if err != nil {
				return err
			}
			return printSnapshots(cmd.OutOrStdout(), []client.NamedSnapshot{*s}, f.asJSON, true)
		},
	}

	rm := &cobra.Command{
		Use:   "rm NAME[:TAG]|ID...",
		Short: "Delete named snapshots (refused while a running or paused sandbox started from one)",
		Long: "Delete named snapshots of the account. The server refuses one that a running or paused sandbox started\n" +
			"from (409). Prints each id deleted; the exit status is 1 when any was not.",
		Example: "  sandboxd snapshot rm deps-installed\n" +
			"  sandboxd snapshot rm --json work:v1 tpl_123",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			return removeEach(cmd, args, f.asJSON, func(ref string) (client.NamedSnapshot, string, error) {
				res, err := client.Check(cl.DeleteSnapshotsNameWithResponse(cmd.Context(), ref, &client.DeleteSnapshotsNameParams{AccountID: optional(f.account)}))
				if err != nil {
					return client.NamedSnapshot{}, "", err
				}
				out, err := decoded(res.JSON200)
				if err != nil {
					return client.NamedSnapshot{}, "", err
				}
				return out.Snapshot, out.Snapshot.ID, nil
			})
		},
	}

	promote := &cobra.Command{
		Use:   "template NAME[:TAG]|ID TEMPLATE_NAME[:TAG]",
		Short: "Make a template of a named snapshot (it stays when the snapshot is replaced or deleted)",
		Example: "  sandboxd snapshot template deps-installed py-deps:1\n" +
			"  sandboxd snapshot template --json work:v2 work:stable",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			res, err := client.Check(cl.PostSnapshotsNameTemplateWithResponse(cmd.Context(), args[0], client.PromoteSnapshotRequest{Name: args[1], AccountID: optional(f.account)}))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			return printTemplate(cmd.OutOrStdout(), out.Template, f.asJSON)
		},
	}
	cmd.AddCommand(ls, inspect, rm, promote)
	return cmd
}

// snapshot is GET /api/snapshots/{name}.
func (c *apiClient) snapshot(ctx context.Context, ref, account string) (*client.NamedSnapshot, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	res, err := client.Check(cl.GetSnapshotsNameWithResponse(ctx, ref, &client.GetSnapshotsNameParams{AccountID: optional(account)}))
	if err != nil {
		return nil, err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return nil, err
	}
	return &out.Snapshot, nil
}

// printSnapshots prints snapshots as a table, or as JSON: the one object
// when one is asked for (single), else the array.
func printSnapshots(w io.Writer, list []client.NamedSnapshot, asJSON, single bool) error {
	if asJSON {
		if single && len(list) == 1 {
			return printJSON(w, list[0])
		}
		return printJSON(w, list)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSANDBOX\tCREATED")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.ID, s.Ref, s.SandboxID, s.CreatedAt)
	}
	return tw.Flush()
}

// removeEach deletes each of refs with del, which answers what it deleted
// and its id: each id is printed (or, with asJSON, the list of what was
// deleted at the end), each failure reported as it comes; the exit status
// is 1 when any failed.
func removeEach[T any](cmd *cobra.Command, refs []string, asJSON bool, del func(ref string) (T, string, error)) error {
	deleted := []T{}
	failed := 0
	for _, ref := range refs {
		out, id, err := del(ref)
		if err != nil {
			reportError(cmd.ErrOrStderr(), fmt.Errorf("rm %s: %w", ref, err), asJSON)
			failed++
			continue
		}
		deleted = append(deleted, out)
		if !asJSON {
			fmt.Fprintln(cmd.OutOrStdout(), id)
		}
	}
	if asJSON {
		if err := printJSON(cmd.OutOrStdout(), deleted); err != nil {
			return err
		}
	}
	if failed > 0 {
		return &exitError{code: 1} // each failure was reported
	}
	return nil
}
