package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// timeoutCommands are `sandboxd sandbox timeout ID D` (the sandbox stops D
// from now) and `extend ID D` (D later than it would have), both through
// POST /api/sandboxes/{id}/timeout.
func timeoutCommands(c *apiClient, f *clientFlags) []*cobra.Command {
	set := &cobra.Command{
		Use:   "timeout SANDBOX_ID DURATION",
		Short: "Make a sandbox stop DURATION from now (a paused one: DURATION after it resumes)",
		Example: "  sandboxd sandbox timeout sbx_123 2h\n" +
			"  sandboxd sandbox timeout --json sbx_123 90s",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := lifetimeArg(args[1])
			if err != nil {
				return err
			}
			sb, err := c.setTimeout(cmd.Context(), args[0], f.account, d)
			if err != nil {
				return err
			}
			return printSandbox(cmd.OutOrStdout(), *sb, f.asJSON)
		},
	}
	extend := &cobra.Command{
		Use:   "extend SANDBOX_ID DURATION",
		Short: "Give a sandbox DURATION more than the lifetime it has left",
		Example: "  sandboxd sandbox extend sbx_123 30m\n" +
			"  sandboxd sandbox extend --json sbx_123 1h",
		Args:              cobra.ExactArgs(2),
		ValidArgsFunction: c.sandboxIDs(f, true),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := lifetimeArg(args[1])
			if err != nil {
				return err
			}
			left, err := c.remaining(cmd.Context(), args[0], f.account)
			if err != nil {
				return err
			}
			sb, err := c.setTimeout(cmd.Context(), args[0], f.account, left+d)
			if err != nil {
				return err
			}
			return printSandbox(cmd.OutOrStdout(), *sb, f.asJSON)
		},
	}
	return []*cobra.Command{set, extend}
}

// lifetimeArg reads a DURATION argument (Go's form: 90s, 30m, 2h).
func lifetimeArg(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Millisecond {
		return 0, fmt.Errorf("DURATION %q: give a positive duration such as 90s, 30m or 2h", s)
	}
	return d, nil
}

// setTimeout makes sandbox id stop d from now.
func (c *apiClient) setTimeout(ctx context.Context, id, account string, d time.Duration) (*client.Sandbox, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	res, err := client.Check(cl.PostSandboxesIDTimeoutWithResponse(ctx, id, client.TimeoutRequest{Timeout: int(d.Milliseconds()), AccountID: optional(account)}))
	if err != nil {
		return nil, err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return nil, err
	}
	return &out.Sandbox, nil
}

// remaining is the lifetime sandbox id has left.
func (c *apiClient) remaining(ctx context.Context, id, account string) (time.Duration, error) {
	cl, err := c.api()
	if err != nil {
		return 0, err
	}
	res, err := client.Check(cl.GetSandboxesWithResponse(ctx, &client.GetSandboxesParams{SandboxID: &id, AccountID: optional(account)}))
	if err != nil {
		return 0, err
	}
	out, err := decoded(res.JSON200)
	if err != nil {
		return 0, err
	}
	for _, sb := range out.Sandboxes {
		if sb.SandboxID == id {
			return time.Duration(sb.Timeout) * time.Millisecond, nil
		}
	}
	return 0, sandboxNotFound()
}
