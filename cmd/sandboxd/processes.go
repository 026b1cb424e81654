package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/api"
)

// processCommands are `sandboxd sandbox ps` and `sandboxd sandbox kill`:
// the processes of a running sandbox (those exec and runs started, which
// outlive their caller), and a kill of one with everything it started.
func processCommands(c *apiClient, account *string, asJSON *bool) []*cobra.Command {
	query := func(extra url.Values) string {
		q := url.Values{}
		if *account != "" {
			q.Set("account_id", *account)
		}
		for k, v := range extra {
			q[k] = v
		}
		if len(q) == 0 {
			return ""
		}
		return "?" + q.Encode()
	}
	ps := &cobra.Command{
		Use:   "ps SANDBOX_ID",
		Short: "List the processes running in a sandbox (exec and runs started them)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out api.ProcessesResponse
			if err := c.do(cmd.Context(), http.MethodGet, "/api/sandboxes/"+url.PathEscape(args[0])+"/processes"+query(nil), nil, &out); err != nil {
				return err
			}
			if *asJSON {
				return printJSON(cmd.OutOrStdout(), out.Processes)
			}
			return printProcesses(cmd.OutOrStdout(), out.Processes)
		},
	}
	var signal string
	kill := &cobra.Command{
		Use:   "kill SANDBOX_ID PID",
		Short: "Kill a process of a sandbox and everything it started",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var extra url.Values
			if signal != "" {
				extra = url.Values{"signal": {strings.ToUpper(signal)}}
			}
			var out api.StatusResponse
			path := "/api/sandboxes/" + url.PathEscape(args[0]) + "/processes/" + url.PathEscape(args[1]) + query(extra)
			if err := c.do(cmd.Context(), http.MethodDelete, path, nil, &out); err != nil {
				return err
			}
			if *asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "killed process %s\n", args[1])
			return err
		},
	}
	kill.Flags().StringVar(&signal, "signal", "", "SIGKILL (default), SIGTERM, SIGINT, SIGHUP or SIGQUIT")
	return []*cobra.Command{ps, kill}
}

func printProcesses(w io.Writer, ps []api.Process) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tTAG\tSTARTED\tPTY\tCOMMAND")
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%v\t%s\n", p.PID, p.Tag, p.StartedAt, p.PTY, strings.Join(p.Command, " "))
	}
	return tw.Flush()
}
