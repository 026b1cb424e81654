package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestMCPSnippets(t *testing.T) {
	run := func(args ...string) (string, error) {
		t.Helper()
		cmd := newMCPCmd()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("--url", "https://sb.example.com/", "--key", "sbx_k'ey", "--client", "claude-code")
	if err != nil || strings.TrimSpace(out) != `claude mcp add --transport http sandboxd https://sb.example.com/mcp --header 'Authorization: Bearer sbx_k'\''ey'` {
		t.Fatalf("claude-code: %v %q", err, out)
	}
	for client, check := range map[string]func(map[string]any) bool{
		"cursor": func(m map[string]any) bool {
			s := m["mcpServers"].(map[string]any)["box"].(map[string]any)
			return s["url"] == "http://10.0.0.5:8080/mcp" && s["headers"].(map[string]any)["Authorization"] == "Bearer sbx_1"
		},
		"vscode": func(m map[string]any) bool {
			s := m["servers"].(map[string]any)["box"].(map[string]any)
			return s["type"] == "http" && s["url"] == "http://10.0.0.5:8080/mcp"
		},
		"claude-desktop": func(m map[string]any) bool {
			s := m["mcpServers"].(map[string]any)["box"].(map[string]any)
			args, _ := json.Marshal(s["args"])
			return s["command"] == "npx" && strings.Contains(string(args), `"http://10.0.0.5:8080/mcp"`) && strings.Contains(string(args), `"--allow-http"`) &&
				s["env"].(map[string]any)["SANDBOXD_AUTH_HEADER"] == "Bearer sbx_1"
		},
	} {
		out, err := run("--url", "http://10.0.0.5:8080", "--key", "sbx_1", "--name", "box", "--client", client)
		var m map[string]any
		if err != nil || json.Unmarshal([]byte(out), &m) != nil || !check(m) {
			t.Errorf("%s: %v\n%s", client, err, out)
		}
	}
	if out, err := run("--key", "sbx_1"); err != nil || strings.Count(out, "\n# ") != 3 || !strings.HasPrefix(out, "# Claude Code") {
		t.Errorf("all: %v\n%s", err, out)
	}
	if _, err := run("--url", "ftp://x", "--key", "k"); err == nil {
		t.Error("ftp URL accepted")
	}
	if _, err := run("--client", "emacs"); err == nil {
		t.Error("unknown client accepted")
	}
}
