package mcpserver

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/contract"
)

// TestCodeAnswer: images become image content whether the result came from
// this node's interpreter (JSON) or another node's answer (a string); the
// structured content names them instead of repeating their bytes; text,
// logs and the error are the text content.
func TestCodeAnswer(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake")
	b64 := base64.StdEncoding.EncodeToString(png)
	raw, _ := json.Marshal(b64)
	text := "   a\n0  1"
	resp := contract.CodeResponse{
		Status: "success",
		Logs:   contract.CodeLogs{Stdout: []string{"printed\n"}, Stderr: []string{"warned\n"}},
		Results: []contract.CodeResult{
			{PNG: json.RawMessage(raw), Text: new("<Figure>")},
			{JPEG: b64},
			{Text: &text, IsMainResult: true},
		},
		Error: &contract.CodeError{Name: "ValueError", Value: "bad", Traceback: "Traceback: line 1"},
	}
	res := codeAnswer(resp)
	var images int
	var got string
	for _, c := range res.Content {
		switch v := c.(type) {
		case *mcp.ImageContent:
			if !bytes.Equal(v.Data, png) {
				t.Errorf("image %s: %q", v.MIMEType, v.Data)
			}
			images++
		case *mcp.TextContent:
			got += v.Text
		}
	}
	if images != 2 {
		t.Errorf("%d images, want 2", images)
	}
	for _, want := range []string{"printed\n", "[stderr]\nwarned\n", text, "[error] ValueError: bad\nTraceback: line 1"} {
		if !strings.Contains(got, want) {
			t.Errorf("the text lacks %q: %q", want, got)
		}
	}
	if strings.Contains(got, "<Figure>") {
		t.Errorf("an image's text stands in the text: %q", got)
	}
	data, _ := json.Marshal(res.StructuredContent)
	if bytes.Contains(data, []byte(b64)) || !bytes.Contains(data, []byte("image/png of 12 bytes, sent as image content")) {
		t.Errorf("structured content: %s", data)
	}
	if res.IsError {
		t.Error("an exception of the code is not the tool's error")
	}
}
