package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func newVersionCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print the version",
		Example: "  sandboxd version\n  sandboxd version --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if asJSON {
				return printJSON(cmd.OutOrStdout(), struct {
					Version string `json:"version"`
					Go      string `json:"go"`
				}{binaryVersion(), runtime.Version()})
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "sandboxd", binaryVersion())
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"version", "go"}`)
	return cmd
}

// binaryVersion is the version the build gave, or the module's when the
// binary was installed with go install.
func binaryVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return version
}
