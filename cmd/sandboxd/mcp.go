package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// keyPlaceholder stands in for the key when none is given, so the
// snippets can be printed (and pasted into docs) without a secret.
const keyPlaceholder = "YOUR_SANDBOXD_API_KEY"

// mcpClients are the clients `sandboxd mcp` prints configuration for.
var mcpClients = []string{"claude-code", "claude-desktop", "cursor", "vscode"}

func newMCPCmd() *cobra.Command {
	var serverURL, key, name, client string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Print the configuration that connects MCP clients (Claude Code, Claude Desktop, Cursor, VS Code) to a server's /mcp",
		Long: "Prints configuration snippets for common MCP clients that reach the server's MCP endpoint (/mcp, the Streamable HTTP transport)\n" +
			"with the API key as Authorization: Bearer. Without --key (or SANDBOXD_API_KEY) the snippets hold a placeholder.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			endpoint, err := mcpEndpoint(serverURL)
			if err != nil {
				return err
			}
			if client != "all" && !slices.Contains(mcpClients, client) {
				return fmt.Errorf("--client must be all or one of %s", strings.Join(mcpClients, ", "))
			}
			if key == "" {
				key = keyPlaceholder
				fmt.Fprintln(cmd.ErrOrStderr(), "sandboxd: no --key or SANDBOXD_API_KEY; the snippets say "+keyPlaceholder)
			}
			return printMCPConfig(cmd.OutOrStdout(), client, name, endpoint, key)
		},
	}
	f := cmd.Flags()
	f.StringVar(&serverURL, "url", "http://127.0.0.1:8080", "server URL as the MCP client reaches it (env SANDBOXD_URL)")
	f.StringVar(&key, "key", "", "API key (env SANDBOXD_API_KEY)")
	f.StringVar(&name, "name", "sandboxd", "name of the server in the client's configuration")
	f.StringVar(&client, "client", "all", "print only this client's snippet: "+strings.Join(mcpClients, ", "))
	return cmd
}

// mcpEndpoint is the /mcp URL of the server at base.
func mcpEndpoint(base string) (string, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("--url must be an http or https URL, got %q", base)
	}
	return u.String() + "/mcp", nil
}

// printMCPConfig writes the snippet of one client, or of all of them with
// a heading each.
func printMCPConfig(w io.Writer, client, name, endpoint, key string) error {
	bearer := "Bearer " + key
	headers := map[string]string{"Authorization": bearer}
	// Claude Desktop's file starts local (stdio) servers only: mcp-remote
	// bridges to the HTTP endpoint. The header travels in an environment
	// variable because some clients mangle arguments with spaces.
	bridge := []string{"-y", "mcp-remote", endpoint, "--header", "Authorization:${SANDBOXD_AUTH_HEADER}"}
	if strings.HasPrefix(endpoint, "http://") {
		bridge = append(bridge, "--allow-http")
	}
	snippets := map[string]struct {
		title string
		text  func() (string, error)
	}{
		"claude-code": {"Claude Code (run in a shell)", func() (string, error) {
			return fmt.Sprintf("claude mcp add --transport http %s %s --header %s", shellQuote(name), shellQuote(endpoint), shellQuote("Authorization: "+bearer)), nil
		}},
		"claude-desktop": {"Claude Desktop (claude_desktop_config.json)", func() (string, error) {
			return indentJSON(map[string]any{"mcpServers": map[string]any{name: stdioServer{
				Command: "npx", Args: bridge, Env: map[string]string{"SANDBOXD_AUTH_HEADER": bearer},
			}}})
		}},
		"cursor": {"Cursor (~/.cursor/mcp.json)", func() (string, error) {
			return indentJSON(map[string]any{"mcpServers": map[string]any{name: httpServer{URL: endpoint, Headers: headers}}})
		}},
		"vscode": {"VS Code (.vscode/mcp.json)", func() (string, error) {
			return indentJSON(map[string]any{"servers": map[string]any{name: httpServer{Type: "http", URL: endpoint, Headers: headers}}})
		}},
	}
	for i, c := range mcpClients {
		if client != "all" && client != c {
			continue
		}
		text, err := snippets[c].text()
		if err != nil {
			return err
		}
		if client == "all" {
			if i > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "# %s\n", snippets[c].title)
		}
		fmt.Fprintln(w, text)
	}
	return nil
}

// httpServer and stdioServer are client configuration entries, in the
// order their documentation shows the fields.
type httpServer struct {
	Type    string            `json:"type,omitempty"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
}

type stdioServer struct {
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
}

func indentJSON(v any) (string, error) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:@=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
