package main

import (
	"context"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	client "github.com/sandboxd/sandboxd/clients/go"
)

// completionTimeout bounds the API call behind a completion: a shell
// waits for it at every Tab.
const completionTimeout = 3 * time.Second

// sandboxIDs is the shell completion of a command whose first argument is
// a sandbox id: the account's sandboxes (the newest 100 and every active
// one), each with its status, live ones only when live is set. Any
// failure (no key, no server) completes nothing, quietly: a shell's
// completion has nowhere to say why.
func (c *apiClient) sandboxIDs(f *clientFlags, live bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return c.completeIDs(cmd, f, live, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
	}
}

// completeIDs lists the sandbox ids that start with prefix, each followed
// by suffix and described by its status.
func (c *apiClient) completeIDs(cmd *cobra.Command, f *clientFlags, live bool, prefix, suffix string) []cobra.Completion {
	// A completion runs no command, so nothing has read the flags'
	// environment variables yet.
	if applyEnv(cmd.Flags(), os.LookupEnv) != nil || c.key == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	cl, err := c.api()
	if err != nil {
		return nil
	}
	res, err := client.Check(cl.GetSandboxesWithResponse(ctx, &client.GetSandboxesParams{AccountID: optional(f.account)}))
	if err != nil || res.JSON200 == nil {
		return nil
	}
	var out []cobra.Completion
	for _, sb := range res.JSON200.Sandboxes {
		if live && !isActive(string(sb.SandboxStatus)) || !strings.HasPrefix(sb.SandboxID, prefix) {
			continue
		}
		out = append(out, cobra.CompletionWithDesc(sb.SandboxID+suffix, string(sb.SandboxStatus)))
	}
	return out
}

// isActive says whether a sandbox of this status has not ended.
func isActive(status string) bool {
	return status != "stopped" && status != "failed"
}
