package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// rmCommand is `sandboxd sandbox rm ID...`: stopped and failed sandboxes
// deleted now (DELETE /api/sandboxes/{id}) rather than when the server's
// retention gets to them; --force stops live ones first, --all-stopped
// deletes every ended one.
func rmCommand(c *apiClient, f *clientFlags) *cobra.Command {
	var force, allStopped bool
	cmd := &cobra.Command{
		Use:   "rm SANDBOX_ID... | --all-stopped",
		Short: "Delete stopped or failed sandboxes now (--force stops running ones first)",
		Long: "Delete sandboxes that stopped or failed, with the keys minted for them, now rather than when the server's\n" +
			"retention does (--keep-stopped-sandboxes). A sandbox that has not ended is refused unless --force, which\n" +
			"stops it first; one that a run still executing names is refused until the run ends. Prints each id\n" +
			"deleted; the exit status is 1 when any was not.",
		Example: "  sandboxd sandbox rm sbx_123 sbx_456\n" +
			"  sandboxd sandbox rm --force sbx_123\n" +
			"  sandboxd sandbox rm --all-stopped",
		Args: func(cmd *cobra.Command, args []string) error {
			if allStopped {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.MinimumNArgs(1)(cmd, args)
		},
		ValidArgsFunction: c.sandboxIDs(f, false),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids := args
			if allStopped {
				var err error
				if ids, err = c.endedSandboxes(cmd.Context(), f.account); err != nil {
					return err
				}
			}
			deleted := []client.Sandbox{}
			failed := 0
			for _, id := range ids {
				sb, err := c.remove(cmd.Context(), id, f.account, force)
				if err != nil {
					reportError(cmd.ErrOrStderr(), fmt.Errorf("rm %s: %w", id, err), f.asJSON)
					failed++
					continue
				}
				deleted = append(deleted, *sb)
				if !f.asJSON {
					fmt.Fprintln(cmd.OutOrStdout(), sb.SandboxID)
				}
			}
			if f.asJSON {
				if err := printJSON(cmd.OutOrStdout(), deleted); err != nil {
					return err
				}
			}
			if failed > 0 {
				// Each failure was reported as it happened.
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&force, "force", "f", false, "stop a sandbox that has not ended, then delete it")
	cmd.Flags().BoolVar(&allStopped, "all-stopped", false, "delete every stopped or failed sandbox of the account")
	return cmd
}

// remove deletes sandbox id, stopping it first when force says so and the
// server refused because it lives.
func (c *apiClient) remove(ctx context.Context, id, account string, force bool) (*client.Sandbox, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	del := func() (*client.Sandbox, error) {
		res, err := client.Check(cl.DeleteSandboxesIDWithResponse(ctx, id, client.AccountRequest{AccountID: optional(account)}))
		if err != nil {
			return nil, err
		}
		out, err := decoded(res.JSON200)
		if err != nil {
			return nil, err
		}
		return &out.Sandbox, nil
	}
	sb, err := del()
	var refused *client.Error
	if err == nil || !errors.As(err, &refused) || refused.StatusCode != http.StatusConflict {
		return sb, err
	}
	if !force {
		return nil, fmt.Errorf("%w (rm --force stops it first)", err)
	}
	if _, err := client.Check(cl.PostSandboxesIDStopWithResponse(ctx, id, client.AccountRequest{AccountID: optional(account)})); err != nil {
		return nil, fmt.Errorf("stop: %w", err)
	}
	return del()
}

// endedSandboxes are the ids of the account's stopped and failed
// sandboxes, every page of them.
func (c *apiClient) endedSandboxes(ctx context.Context, account string) ([]string, error) {
	cl, err := c.api()
	if err != nil {
		return nil, err
	}
	out, err := listSandboxes(ctx, cl, account, true)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, sb := range out.Sandboxes {
		if !isActive(string(sb.SandboxStatus)) {
			ids = append(ids, sb.SandboxID)
		}
	}
	return ids, nil
}
