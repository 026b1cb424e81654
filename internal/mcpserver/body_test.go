package mcpserver

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestOversizedRequestIsJSONRPCError: a request body over the limit is
// answered 413 with a JSON-RPC error response, carrying the call's id when
// it comes before the cut, and the SDK's client sees that error on its
// call and keeps its session.
func TestOversizedRequestIsJSONRPCError(t *testing.T) {
	f := newFixture(t)
	big := strings.Repeat("x", mcp.DefaultMaxRequestBodyBytes)
	for _, tc := range []struct {
		name, body string
		want       jsonrpc.ID
	}{
		{"id first", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"a.txt","content":"` + big + `"}}}`, mustID(t, 7.0)},
		{"string id after a small member", `{"jsonrpc":"2.0","method":"tools/call","id":"call-1","params":{"name":"write_file","arguments":{"path":"a.txt","content":"` + big + `"}}}`, mustID(t, "call-1")},
		{"id after the params", `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"write_file","arguments":{"path":"a.txt","content":"` + big + `"}},"id":8}`, jsonrpc.ID{}},
		{"batch", `[{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"a.txt","content":"` + big + `"}}}]`, jsonrpc.ID{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, ctype, body := f.post(t, "alice", tc.body)
			if status != http.StatusRequestEntityTooLarge || ctype != "application/json" {
				t.Fatalf("%d %s %.200s", status, ctype, body)
			}
			msg, err := jsonrpc.DecodeMessage(body)
			if tc.want.IsValid() && err != nil {
				t.Fatalf("not a JSON-RPC response: %v: %s", err, body)
			}
			if !tc.want.IsValid() {
				// A response without an id: MCP's form for a request the
				// server could not read.
				if string(body) != `{"jsonrpc":"2.0","error":{"code":-32600,"message":"request body exceeds 4194304 bytes"}}` {
					t.Fatalf("body %s", body)
				}
				return
			}
			resp, ok := msg.(*jsonrpc.Response)
			if !ok || resp.ID != tc.want || resp.Error == nil || !strings.Contains(resp.Error.Error(), "request body exceeds 4194304 bytes") {
				t.Fatalf("response %+v: %s", msg, body)
			}
		})
	}

	// The SDK's client gets the error on its call, and its session works on.
	cs := f.connect(t, "alice")
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"path": "a.txt", "content": big}})
	if err == nil || !strings.Contains(err.Error(), "request body exceeds 4194304 bytes") {
		t.Fatalf("oversized call: %v", err)
	}
	if text, isErr := callTool(t, cs, "write_file", map[string]any{"path": "a.txt", "content": "small"}); isErr {
		t.Fatalf("the next call: %s", text)
	}
}

// post sends one raw JSON-RPC message to /mcp with who's key.
func (f *fixture) post(t *testing.T, who, body string) (status int, contentType string, data []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+Path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+f.keys[who])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err = io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), data
}

func mustID(t *testing.T, v any) jsonrpc.ID {
	t.Helper()
	id, err := jsonrpc.MakeID(v)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
