package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMCPWire checks what MCP clients see of /mcp beyond the tools'
// results: the input schemas of tools/list, validated by ajv (what the
// TypeScript MCP SDK and many clients validate arguments with) against the
// documented arguments of internal/mcpserver/testdata/arguments.json, and
// the answer to a request over the size limit.
func TestMCPWire(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "mcp-wire.db"))
	k := s.createKey(s.createAccount("wire", false).ID)

	t.Run("ajv validates every tool's input schema", func(t *testing.T) {
		node := findNode(t)
		dir, err := filepath.Abs("mcp")
		if err != nil {
			t.Fatal(err)
		}
		npmCI(t, node, dir)
		cases, err := os.ReadFile(filepath.Join("..", "internal", "mcpserver", "testdata", "arguments.json"))
		if err != nil {
			t.Fatal(err)
		}
		type listed struct {
			Name        string `json:"name"`
			InputSchema any    `json:"inputSchema"`
		}
		input := struct {
			Tools []listed        `json:"tools"`
			Cases json.RawMessage `json:"cases"`
		}{Cases: cases}
		for tool, err := range s.mcpConnect(k).cs.Tools(context.Background(), nil) {
			if err != nil {
				t.Fatal(err)
			}
			input.Tools = append(input.Tools, listed{tool.Name, tool.InputSchema})
		}
		data, err := json.Marshal(input)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "schemas.json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := node.run(ctx, t, dir, nil, node.bin, "check-schemas.mjs", path); err != nil {
			t.Fatalf("ajv: %v", err)
		}
	})

	t.Run("a request over the size limit is a JSON-RPC error", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"big.txt","content":"` + strings.Repeat("x", 4<<20) + `"}}}`
		req, err := http.NewRequest(http.MethodPost, s.base+"/mcp", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+k.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var msg struct {
			JSONRPC string `json:"jsonrpc"`
			ID      any    `json:"id"`
			Error   struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if resp.StatusCode != http.StatusRequestEntityTooLarge || resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(raw, &msg) != nil ||
			msg.JSONRPC != "2.0" || msg.ID != 42.0 || msg.Error.Code != -32600 || !strings.Contains(msg.Error.Message, "exceeds 4194304 bytes") {
			t.Fatalf("%d %s: %.300s", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
		}
	})
}
