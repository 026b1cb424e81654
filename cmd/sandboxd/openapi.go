package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/api"
)

// newOpenAPICmd is `sandboxd openapi`: the document the server serves at
// GET /api/openapi.json, without a server. `go generate ./clients/go` writes
// the committed copy (api/openapi.json) with it, which the typed clients
// are generated from.
func newOpenAPICmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "openapi",
		Short: "Print the OpenAPI document of the API (what GET /api/openapi.json serves)",
		Long: "Print the OpenAPI document of the API: what GET /api/openapi.json of a server of this binary serves.\n" +
			"Its info.version is the binary's; the committed api/openapi.json is written by `go generate ./clients/go`\n" +
			"(a binary without a version, \"dev\"), which then generates the Go client from it.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			doc, err := api.OpenAPIDocument(version)
			if err != nil {
				return err
			}
			doc = append(doc, '\n')
			if output == "" || output == "-" {
				_, err := cmd.OutOrStdout().Write(doc)
				return err
			}
			if err := os.WriteFile(output, doc, 0o644); err != nil {
				return fmt.Errorf("write %s: %w", output, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write it to this file instead of stdout")
	return cmd
}
