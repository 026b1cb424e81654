package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sandboxd/sandboxd/internal/store"
)

// templateOf decodes a template tool's structured answer.
func templateOf(t *testing.T, res *mcp.CallToolResult) (tpl map[string]any, note string, finished any) {
	t.Helper()
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Template map[string]any `json:"template"`
		Note     string         `json:"note"`
		Finished any            `json:"finished"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return out.Template, out.Note, out.Finished
}

func callFull(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

// TestTemplateTools: the template tools over the real templates service
// (builds queued, finished here through the store): a build answers the
// template building, the API's refusals come back as tool errors, list
// filters by status, get resolves an id or name[:tag] and answers the
// log's tail, a build that waits follows the build to its end (a failed
// one is an error result), delete, and another account sees nothing.
func TestTemplateTools(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alice, bob := f.connect(t, "alice"), f.connect(t, "bob")

	// The API's own refusals, with its messages.
	for _, tc := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"image": "registry.example/a"}, "name: required"},
		{map[string]any{"name": "a"}, "image: required"},
		{map[string]any{"name": "Bad", "image": "registry.example/a"}, "template name"},
		{map[string]any{"name": "a", "image": "registry.example/a", "dockerfile": "FROM registry.example/x\n"}, "image: must be absent with a dockerfile"},
		{map[string]any{"name": "a", "image": "registry.example/a", "steps": []any{map[string]any{"type": "RUN", "args": []string{"true"}}}}, "cannot run build steps"},
		{map[string]any{"name": "a", "fromTemplate": "base"}, "fromTemplate"},
	} {
		if text, isErr := callTool(t, alice, "build_template", tc.args); !isErr || !strings.Contains(text, tc.want) {
			t.Errorf("build_template %v: %v %q, want %q", tc.args, isErr, text, tc.want)
		}
	}

	res := callFull(t, alice, "build_template", map[string]any{"name": "py:3", "image": "registry.example/py:3"})
	tpl, note, finished := templateOf(t, res)
	if res.IsError || tpl["status"] != "building" || tpl["name"] != "py" || tpl["tag"] != "3" || finished != false || !strings.Contains(note, "get_template") {
		t.Fatalf("build: %v %v %q %v", res.IsError, tpl, note, finished)
	}
	id := tpl["id"].(string)
	if text, isErr := callTool(t, alice, "build_template", map[string]any{"name": "py:3", "image": "registry.example/py:3"}); !isErr || !strings.Contains(text, "py:3") {
		t.Fatalf("same name and tag: %v %s", isErr, text)
	}

	// Get by id and by name:tag, with the log's tail.
	for i := range 80 {
		if err := f.st.AppendTemplateLog(ctx, id, fmt.Sprintf("line %d\n", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, ref := range []string{id, "py:3"} {
		res := callFull(t, alice, "get_template", map[string]any{"template": ref})
		tpl, note, _ := templateOf(t, res)
		log, _ := tpl["log"].(string)
		if res.IsError || tpl["id"] != id || strings.Count(log, "\n") != defaultLogLines || !strings.HasSuffix(log, "line 79\n") || !strings.Contains(note, "last 50 of") {
			t.Fatalf("get %s: %v %v %q", ref, res.IsError, tpl, note)
		}
	}
	res = callFull(t, alice, "get_template", map[string]any{"template": id, "log_lines": 2})
	if tpl, _, _ := templateOf(t, res); tpl["log"] != "line 78\nline 79\n" {
		t.Fatalf("two lines: %v", tpl["log"])
	}
	if text, isErr := callTool(t, alice, "get_template", map[string]any{"template": "py"}); !isErr || !strings.Contains(text, "template py not found") {
		t.Fatalf("py (latest): %v %s", isErr, text)
	}

	// Over a template: not while it builds.
	if text, isErr := callTool(t, alice, "build_template", map[string]any{"name": "x", "fromTemplate": id}); !isErr || !strings.Contains(text, "still building") {
		t.Fatalf("over a building template: %v %s", isErr, text)
	}

	// list_templates, by status.
	if text, isErr := callTool(t, alice, "list_templates", map[string]any{"status": "building"}); isErr || !strings.Contains(text, id) {
		t.Fatalf("list building: %s", text)
	}
	if text, isErr := callTool(t, alice, "list_templates", map[string]any{"status": "ready"}); isErr || strings.Contains(text, id) {
		t.Fatalf("list ready: %s", text)
	}

	// Another account: nothing, by id or by name.
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"get_template", map[string]any{"template": id}, "Template not found"},
		{"get_template", map[string]any{"template": "py:3"}, "template py:3 not found"},
		{"delete_template", map[string]any{"template": id}, "Template not found"},
		{"build_template", map[string]any{"name": "x", "fromTemplate": id}, "fromTemplate: template " + id + " not found"},
		{"build_template", map[string]any{"name": "x", "fromTemplate": "py:3"}, "fromTemplate: template py:3 not found"},
	} {
		if text, isErr := callTool(t, bob, tc.tool, tc.args); !isErr || !strings.Contains(text, tc.want) {
			t.Errorf("bob %s %v: %v %q, want %q", tc.tool, tc.args, isErr, text, tc.want)
		}
	}
	if text, isErr := callTool(t, bob, "list_templates", nil); isErr || strings.Contains(text, id) {
		t.Fatalf("bob lists: %s", text)
	}

	// A build that waits: followed until it ends; a failure is an error
	// result that says why, with the template.
	waited := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := alice.CallTool(ctx, &mcp.CallToolParams{Name: "build_template", Arguments: map[string]any{"name": "tools", "image": "registry.example/tools", "wait": true}})
		if err != nil {
			t.Error(err)
		}
		waited <- res
	}()
	var tools store.Template
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if tools, err = f.st.FindTemplate(ctx, f.alice.ID, "tools", "latest"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiting build made no template")
		}
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case res := <-waited:
		t.Fatalf("build_template answered while building: %+v", res)
	default:
	}
	if _, err := f.st.FinishTemplate(ctx, tools.ID, store.TemplateFailed, "", "", "image registry.example/tools not found"); err != nil {
		t.Fatal(err)
	}
	select {
	case res = <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("build_template still waits after the build failed")
	}
	tpl, _, finished = templateOf(t, res)
	text := res.Content[0].(*mcp.TextContent).Text
	if !res.IsError || finished != true || tpl["status"] != "failed" || !strings.HasPrefix(text, "The build of tools:latest failed: image registry.example/tools not found") {
		t.Fatalf("waited build: %v %v %q", res.IsError, tpl, text)
	}

	// Delete by name; then it is gone.
	res = callFull(t, alice, "delete_template", map[string]any{"template": "py:3"})
	if tpl, _, _ := templateOf(t, res); res.IsError || tpl["id"] != id {
		t.Fatalf("delete: %+v", res)
	}
	if text, isErr := callTool(t, alice, "get_template", map[string]any{"template": id}); !isErr || !strings.Contains(text, "Template not found") {
		t.Fatalf("get deleted: %v %s", isErr, text)
	}
}
