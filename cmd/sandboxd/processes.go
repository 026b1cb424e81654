package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// processCommands are `sandboxd sandbox ps` and `sandboxd sandbox kill`:
// the processes of a running sandbox (those exec and runs started, which
// outlive their caller), and a kill of one with everything it started.
func processCommands(c *apiClient, f *clientFlags) []*cobra.Command {
	account, asJSON := &f.account, &f.asJSON
	ps := &cobra.Command{
		Use:               "ps SANDBOX_ID",
		Short:             "List the processes running in a sandbox (exec and runs started them)",
		Example:           "  sandboxd sandbox ps sbx_123\n  sandboxd sandbox ps --json sbx_123",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			params := &client.GetSandboxesIDProcessesParams{AccountID: optional(*account)}
			res, err := client.Check(cl.GetSandboxesIDProcessesWithResponse(cmd.Context(), args[0], params))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
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
		Use:               "kill SANDBOX_ID PID",
		Short:             "Kill a process of a sandbox and everything it started",
		Example:           "  sandboxd sandbox kill sbx_123 42\n  sandboxd sandbox kill --signal SIGTERM sbx_123 42",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := c.api()
			if err != nil {
				return err
			}
			params := &client.DeleteSandboxesIDProcessesPidParams{AccountID: optional(*account)}
			if signal != "" {
				// The server names the signals it takes; an unknown
				// one is its 400 to report.
				params.Signal = optional(client.DeleteSandboxesIDProcessesPidParamsSignal(strings.ToUpper(signal)))
			}
			res, err := client.Check(cl.DeleteSandboxesIDProcessesPidWithResponse(cmd.Context(), args[0], args[1], params))
			if err != nil {
				return err
			}
			out, err := decoded(res.JSON200)
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "killed process %s\n", args[1])
			return err
		},
	}
	kill.Flags().StringVar(&signal, "signal", "", "SIGKILL (default), SIGTERM, SIGINT, SIGHUP or SIGQUIT")
	return []*cobra.Command{ps, kill}
}

func printProcesses(w io.Writer, ps []client.Process) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tTAG\tSTARTED\tPTY\tCOMMAND")
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%v\t%s\n", p.Pid, deref(p.Tag), p.StartedAt, p.Pty, strings.Join(p.Command, " "))
	}
	return tw.Flush()
}
