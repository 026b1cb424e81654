package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The first hour of a new user (issue 31): what a server says when it
// cannot do what is asked, and what it stores and shows.

// TestPromptNeedsAModel: on a server with opencode but no model, a prompt
// is refused at once with a 400 naming the flags that configure one, on
// the API and through MCP, and nothing is started; before, opencode ran
// for a minute and a half and the run said COMPLETED.
func TestPromptNeedsAModel(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "nomodel.db"), "--rootfs", agentRootfs(t))
	k := s.createKey(s.createAccount("newcomer", false).ID)
	r := s.as(k, "POST", "/api/sandboxes", map[string]any{"prompt": "create a hello world index.html"})
	msg, _ := r.Body["error"].(string)
	if r.Status != 400 || !strings.Contains(msg, "--model-base-url") || !strings.Contains(msg, "--model NAME") {
		t.Fatalf("prompt without a model: %d %s, want 400 naming --model-base-url and --model", r.Status, r.Raw)
	}
	tool := s.mcpConnect(k).call(t, "prompt_sandbox", map[string]any{"prompt": "hi"}, "")
	if !tool.IsError || tool.Text != msg {
		t.Fatalf("prompt_sandbox without a model: %+v, want the API's refusal as an error", tool)
	}
	if n := len(s.as(k, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any)); n != 0 {
		t.Fatalf("%d sandboxes were started for refused prompts", n)
	}
	if n := len(s.as(k, "GET", "/api/tasks/runs", nil).Body["runs"].([]any)); n != 0 {
		t.Fatalf("%d runs were started for refused prompts", n)
	}
}

// colourScript prints what a CLI prints on a terminal whatever NO_COLOR
// says: a window title, colours, a spinner's erase, a hyperlink; and the
// variables that ask colours off.
const colourScript = `printf '\033]0;agent\007\033[1;32mdone\033[0m \033]8;;http://x.test/\033\\link\033]8;;\033\\\n'
printf '\033[31mError:\033[39m no provider\r\033[2K\n' >&2
echo "NO_COLOR=$NO_COLOR FORCE_COLOR=$FORCE_COLOR TERM=$TERM"`

// TestRunOutputIsText: a run's command is told it has no terminal, and
// what it prints for one anyway is stored as text: in the run's output and
// in its log, whose stream shows no escape sequence.
func TestRunOutputIsText(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "text.db"))
	k := s.createKey(s.createAccount("reader", false).ID)
	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", colourScript}})
	r := s.waitRun(k, sb["runId"].(string), time.Minute)
	want := "done link\nNO_COLOR=1 FORCE_COLOR=0 TERM=dumb\n"
	if r.Status != "COMPLETED" || r.Output["stdout"] != want || r.Output["stderr"] != "Error: no provider\r\n" {
		t.Fatalf("run %+v, want stdout %q and stderr without escapes", r, want)
	}
	log := s.as(k, "GET", "/api/tasks/runs/"+r.ID+"/log", nil)
	if log.Status != 200 || strings.Contains(string(log.Raw), `\u001b`) || strings.Contains(string(log.Raw), "\x1b") || !strings.Contains(string(log.Raw), "done link") {
		t.Fatalf("run log: %d %s", log.Status, log.Raw)
	}
}
