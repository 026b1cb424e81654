// Command sandboxd is the sandboxd service: the HTTP API, the job workers and
// the sandbox host in one binary, plus the admin, image and bench tools that
// operate on the same data directory.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		var exit *exitError
		if errors.As(err, &exit) {
			os.Exit(exit.code)
		}
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
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
		newVersionCmd(),
		newSandboxCmd(g),
		newBenchCmd(g),
		newKernelCmd(g),
		newMCPCmd(),
		newOpenAPICmd(),
	)
	return root
}
