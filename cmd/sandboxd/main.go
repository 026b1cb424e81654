// Command sandboxd is the sandboxd service: the HTTP API, the job workers and
// the sandbox host in one binary, plus the admin, image and bench tools that
// operate on the same data directory.
package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, err := newRootCmd().ExecuteContextC(ctx)
	if err != nil {
		var exit *exitError
		if errors.As(err, &exit) {
			os.Exit(exit.code)
		}
		reportError(os.Stderr, err, wantsJSON(cmd))
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "sandboxd",
		Short:         "Self-hosted ephemeral Linux sandboxes behind a small REST API",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Every flag also comes from its SANDBOXD_* variable (env.go).
		PersistentPreRunE: withEnv(nil),
	}
	g.register(root)
	root.AddCommand(
		newServeCmd(g),
		newAdminCmd(g),
		newImageCmd(g),
		annotate(newVersionCmd()),
		// The API client logs nothing of its own: only its progress
		// lines follow --log-format.
		annotate(newSandboxCmd(g), "log-format"),
		annotate(newTemplateCmd()),
		annotate(newSnapshotCmd()),
		annotate(newVolumeCmd(g), "log-format"),
		annotate(newEventsCmd()),
		annotate(newWebhookCmd()),
		newBenchCmd(g),
		newKernelCmd(g),
		annotate(newMCPCmd()),
		annotate(newOpenAPICmd()),
	)
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		annotate(c)
	}
	finishTree(root)
	return root
}
