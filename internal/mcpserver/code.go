package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
)

// CodeService reaches a sandbox's code interpreter (package sandbox's
// Manager).
type CodeService interface {
	CodeTarget(ctx context.Context, p auth.Principal, id string) (codeint.Target, error)
}

type codeArgs struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"The running sandbox whose code interpreter runs the code (its image needs Jupyter kernels: the code-interpreter template)"`
	Code      string            `json:"code" jsonschema:"The code: one cell, in the context's language. Variables, imports and definitions stay for the next call in the same context"`
	Language  string            `json:"language,omitempty" jsonschema:"Run in the default context of this language (default python; r where the sandbox has it). Not with context_id"`
	ContextID string            `json:"context_id,omitempty" jsonschema:"Run in this context (as POST /api/sandboxes/{id}/code/contexts made it). Not with language"`
	Envs      map[string]string `json:"envs,omitempty" jsonschema:"Environment variables for this execution only"`
	Timeout   int64             `json:"timeout,omitempty" jsonschema:"Milliseconds before the cell is interrupted (the context keeps its state)"`
	AccountID string            `json:"account_id,omitempty" jsonschema:"Act for this account; default: the key's own"`
}

func (h *Handler) codeTools() []tool {
	return []tool{{name: "run_code", title: "Run code", changes: true, in: reflect.TypeFor[codeArgs](), fn: h.runCode,
		description: "Run code in a running sandbox's code interpreter, a Jupyter kernel that keeps its state between calls (as POST /api/sandboxes/{id}/code). Returns what the code printed, the results (a chart or image as image content, a table as text, and the rest as text), and the error with its traceback if it raised one."}}
}

// runCode runs the code where the sandbox runs and answers its results:
// images as image content, everything else as text, and the execution
// (without the images' bytes) as structured content.
func (h *Handler) runCode(ctx context.Context, c *call) (*mcp.CallToolResult, error) {
	id, err := requiredString(c.args, "sandbox_id")
	if err != nil {
		return nil, err
	}
	req, err := c.args.Code()
	if err != nil {
		return nil, err
	}
	sb, err := h.sandbox(ctx, c.who, req.AccountID, id)
	if err != nil {
		return nil, err
	}
	stop := h.tickProgress(ctx, c.req, func(elapsed time.Duration) string {
		return fmt.Sprintf("the code is running in %s after %s", sb.ID, elapsed.Round(time.Second))
	})
	defer stop()
	var resp contract.CodeResponse
	if node, ok := h.opts.Gate.Elsewhere(ctx, c.who, sb.ID); ok {
		err = h.callNode(ctx, node, c.who, false, http.MethodPost, sandboxPath(sb.ID, "code"), req, &resp)
	} else {
		resp, err = h.codeHere(ctx, c.who, sb.ID, req)
	}
	if err != nil {
		return nil, edge.Explained(err, "Sandbox not found")
	}
	return codeAnswer(resp), nil
}

// codeHere runs req in sandbox id, hosted on this node.
func (h *Handler) codeHere(ctx context.Context, who edge.Caller, id string, req contract.CodeRequest) (contract.CodeResponse, error) {
	if h.opts.Code == nil {
		return contract.CodeResponse{}, &edge.Error{Status: http.StatusNotImplemented, Msg: "this server has no code interpreter"}
	}
	t, err := h.opts.Code.CodeTarget(ctx, who.Principal, id)
	if err != nil {
		return contract.CodeResponse{}, err
	}
	ereq := req.Interpreter()
	start := time.Now()
	var col codeint.Collector
	if err := t.Execute(ctx, ereq, col.Add); err != nil {
		return contract.CodeResponse{}, err
	}
	return contract.CodeResponseOf(col.X, time.Since(start)), nil
}

// codeAnswer is the tool result of an execution.
func codeAnswer(resp contract.CodeResponse) *mcp.CallToolResult {
	var text strings.Builder
	var content []mcp.Content
	if s := strings.Join(resp.Logs.Stdout, ""); s != "" {
		text.WriteString(s)
	}
	if s := strings.Join(resp.Logs.Stderr, ""); s != "" {
		fmt.Fprintf(&text, "[stderr]\n%s", s)
	}
	for i := range resp.Results {
		r := &resp.Results[i]
		img := false
		for _, im := range []struct {
			v    *any
			mime string
		}{{&r.PNG, "image/png"}, {&r.JPEG, "image/jpeg"}} {
			b, ok := imageBytes(*im.v)
			if !ok {
				continue
			}
			content = append(content, &mcp.ImageContent{Data: b, MIMEType: im.mime})
			// The structured content names the image; its bytes are the
			// image content's.
			*im.v = fmt.Sprintf("(%s of %d bytes, sent as image content)", im.mime, len(b))
			img = true
		}
		if r.Text != nil && !img {
			if text.Len() > 0 && !strings.HasSuffix(text.String(), "\n") {
				text.WriteString("\n")
			}
			text.WriteString(*r.Text)
			text.WriteString("\n")
		}
	}
	if resp.Error != nil {
		fmt.Fprintf(&text, "[error] %s: %s\n%s\n", resp.Error.Name, resp.Error.Value, resp.Error.Traceback)
	}
	if resp.Truncated {
		text.WriteString("[some output was left out: past the answer's bounds]\n")
	}
	if text.Len() == 0 {
		text.WriteString("(no output)")
	}
	data, _ := json.Marshal(resp)
	var structured map[string]any
	_ = json.Unmarshal(data, &structured)
	return &mcp.CallToolResult{
		Content:           append([]mcp.Content{&mcp.TextContent{Text: text.String()}}, content...),
		StructuredContent: structured,
	}
}

// imageBytes decodes a result's base64 image: a string, or its JSON as the
// local interpreter gives it.
func imageBytes(v any) ([]byte, bool) {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case json.RawMessage:
		if json.Unmarshal(v, &s) != nil {
			return nil, false
		}
	default:
		return nil, false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	return b, err == nil
}
