package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// lsCommand is `sandboxd sandbox ls`: the account's sandboxes, those that
// have not ended unless --all or --status asks for more.
func lsCommand(c *apiClient, f *clientFlags) *cobra.Command {
	var all bool
	var statuses []string
	cmd := &cobra.Command{
		Use:   "ls [--all] [--status STATUS,...]",
		Short: "List sandboxes: those that have not ended (--all: every one the server keeps)",
		Long: "List the account's sandboxes, newest first. Without flags: those that have not ended (pending, running,\n" +
			"paused, stopping, ...) among the newest 100 and every active one; stopped and failed ones are counted\n" +
			"on stderr. --status keeps only the statuses named; --all lists every sandbox the server keeps\n" +
			"(stopped ones go after --keep-stopped-sandboxes), page by page, whatever its status.",
		Example: "  sandboxd sandbox ls\n" +
			"  sandboxd sandbox ls --all\n" +
			"  sandboxd sandbox ls --status stopped,failed --json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			out, err := listSandboxes(cmd.Context(), cl, f.account, all)
			if err != nil {
				return err
			}
			shown, hidden := filterSandboxes(out.Sandboxes, statuses, all)
			if f.asJSON {
				// The sandboxes and the environment, without the
				// file tree (which can be long), as --json has
				// always printed them.
				return printJSON(cmd.OutOrStdout(), struct {
					Sandboxes  []client.Sandbox `json:"sandboxes"`
					SnapshotID *string          `json:"snapshot_id"`
					GithubRepo *string          `json:"github_repo"`
				}{shown, out.SnapshotID, out.GithubRepo})
			}
			if err := printSandboxes(cmd.OutOrStdout(), shown); err != nil {
				return err
			}
			noteHidden(cmd.ErrOrStderr(), hidden)
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "list every sandbox the server keeps, of every status, page by page")
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "list only sandboxes of these statuses: pending, running, pausing, paused, resuming, stopping, stopped, failed")
	return cmd
}

// filterSandboxes keeps the sandboxes of statuses; without any, every one
// with all, else those that have not ended. hidden counts the ended ones
// left out by that default.
func filterSandboxes(sbs []client.Sandbox, statuses []string, all bool) (shown []client.Sandbox, hidden int) {
	shown = []client.Sandbox{}
	for _, sb := range sbs {
		status := string(sb.SandboxStatus)
		switch {
		case len(statuses) > 0:
			if slices.ContainsFunc(statuses, func(s string) bool { return strings.EqualFold(strings.TrimSpace(s), status) }) {
				shown = append(shown, sb)
			}
		case all || isActive(status):
			shown = append(shown, sb)
		default:
			hidden++
		}
	}
	return shown, hidden
}

// noteHidden says on stderr how many ended sandboxes ls left out, and how
// to see them.
func noteHidden(w io.Writer, n int) {
	switch {
	case n == 1:
		fmt.Fprintln(w, "sandboxd: 1 stopped or failed sandbox not shown (--all or --status stopped,failed shows it)")
	case n > 1:
		fmt.Fprintf(w, "sandboxd: %d stopped or failed sandboxes not shown (--all or --status stopped,failed shows them)\n", n)
	}
}
