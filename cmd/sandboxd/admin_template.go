package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/templates"
)

// newAdminTemplateCmd groups the operator's template commands: public
// templates (account "") are made by publishing an account's ready
// template, never through the API.
func newAdminTemplateCmd(g *globals) *cobra.Command {
	tpl := &cobra.Command{Use: "template", Short: "Manage public templates (the operator's, which every account sees and starts)"}
	var asJSON bool
	publish := &cobra.Command{
		Use:   "publish TEMPLATE_ID [--as NAME[:TAG]]",
		Short: "Publish an account's ready template as a public one (a copy: same image and layers; the account's may be deleted)",
		Example: "  sandboxd admin template publish tpl_0123 --as python:3.12\n" +
			"  sandboxd admin template ls",
		Args: cobra.ExactArgs(1),
		RunE: g.withStore(func(cmd *cobra.Command, args []string, st *store.Store) error {
			as, _ := cmd.Flags().GetString("as")
			t, err := templates.Publish(cmd.Context(), st, args[0], as)
			if err != nil {
				return err
			}
			return printTemplateRows(cmd.OutOrStdout(), asJSON, false, []store.Template{t})
		}),
	}
	publish.Flags().String("as", "", "the public name[:tag] (default: the template's own)")
	unpublish := &cobra.Command{
		Use:     "unpublish NAME[:TAG]",
		Short:   "Delete a public template (refused while sandboxes started from it run or are paused)",
		Example: "  sandboxd admin template unpublish python:3.12 --json",
		Args:    cobra.ExactArgs(1),
		RunE: g.withStore(func(cmd *cobra.Command, args []string, st *store.Store) error {
			t, err := templates.Unpublish(cmd.Context(), st, args[0])
			if err != nil {
				return err
			}
			return printTemplateRows(cmd.OutOrStdout(), asJSON, false, []store.Template{t})
		}),
	}
	ls := &cobra.Command{
		Use:     "ls",
		Short:   "List the public templates",
		Example: "  sandboxd admin template ls --json",
		Args:    cobra.NoArgs,
		RunE: g.withStore(func(cmd *cobra.Command, _ []string, st *store.Store) error {
			// Account "" lists the public templates alone.
			all, err := st.ListTemplates(cmd.Context(), "")
			if err != nil {
				return err
			}
			var pub []store.Template
			for _, t := range all {
				if t.AccountID == "" {
					pub = append(pub, t)
				}
			}
			return printTemplateRows(cmd.OutOrStdout(), asJSON, true, pub)
		}),
	}
	for _, c := range []*cobra.Command{publish, unpublish, ls} {
		c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	}
	tpl.AddCommand(publish, unpublish, ls)
	return tpl
}

// printTemplateRows prints one template as an object or many as an array
// (JSON), or a table; the build log is left out.
func printTemplateRows(w io.Writer, asJSON, many bool, ts []store.Template) error {
	for i := range ts {
		ts[i].Log = ""
	}
	if asJSON {
		if !many {
			return printJSON(w, ts[0])
		}
		if ts == nil {
			ts = []store.Template{}
		}
		return printJSON(w, ts)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tSOURCE\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s:%s\t%s\t%s\t%s\n", t.ID, t.Name, t.Tag, t.Status, t.Source, t.CreatedAt.Format(time.RFC3339))
	}
	return tw.Flush()
}
