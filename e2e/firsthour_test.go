package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
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

// TestFailedSandboxesSayWhy: sandboxes that failed (here: their processes
// died while sandboxd was down, found by the reconcile at its next start)
// say why in failureReason, in words and without host paths, on the REST
// API and in E2B's 404; runs name their sandbox and sandboxes their latest
// run; the account's setup, which its first create started, runs in a
// sandbox its list does not show.
func TestFailedSandboxesSayWhy(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "why.db"), "--rootfs", agentRootfs(t), "--keep-sandboxes=true", "--setup-on-first-use=true")
	a := s.createAccount("unlucky", false)
	k := s.createKey(a.ID)
	var ek key
	s.admin(&ek, "admin", "key", "create", "--account", a.ID, "--format", "e2b", "--json")

	cmd := s.createSandbox(k, map[string]any{"command": "echo", "args": []string{"hi"}})
	if r := s.waitRun(k, cmd["runId"].(string), 2*time.Minute); r.Status != "COMPLETED" {
		t.Fatalf("run %+v", r)
	}
	idle := s.createSandbox(k, map[string]any{})
	e2 := s.call("POST", "/sandboxes", map[string]string{"X-API-Key": ek.Key}, map[string]any{"templateID": "base"})
	if e2.Status != 201 {
		t.Fatalf("E2B create: %d %s", e2.Status, e2.Raw)
	}
	e2bID := e2.Body["sandboxID"].(string)

	// Every run names its sandbox, the setup's too, once it finished.
	var setupSandbox string
	deadline := time.Now().Add(2 * time.Minute)
	for setupSandbox == "" && time.Now().Before(deadline) {
		for _, v := range s.as(k, "GET", "/api/tasks/runs", nil).Body["runs"].([]any) {
			r := v.(map[string]any)
			if r["taskIdentifier"] == "setup-sandbox" && r["isCompleted"] == true {
				if r["status"] != "COMPLETED" {
					t.Fatalf("setup run %v", r)
				}
				setupSandbox, _ = r["sandboxId"].(string)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if setupSandbox == "" {
		t.Fatal("no finished setup run naming its sandbox")
	}
	for _, v := range s.as(k, "GET", "/api/tasks/runs", nil).Body["runs"].([]any) {
		if r := v.(map[string]any); r["sandboxId"] == nil || r["sandboxId"] == "" {
			t.Errorf("run %v names no sandbox", r["id"])
		}
	}
	// The list shows the account's own sandboxes, each with its latest run,
	// and not its setup's (which is found by id).
	list := s.as(k, "GET", "/api/sandboxes", nil).Body["sandboxes"].([]any)
	listed := map[string]map[string]any{}
	for _, v := range list {
		sb := v.(map[string]any)
		listed[sb["sandboxId"].(string)] = sb
	}
	if len(listed) != 3 || listed[setupSandbox] != nil || listed[cmd["sandboxId"].(string)]["runId"] != cmd["runId"] {
		t.Fatalf("list %v: want the command's (with its run), the idle one and the E2B one, not the setup's %s", list, setupSandbox)
	}
	if r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+setupSandbox, nil).Body["sandboxes"].([]any); len(r) != 1 {
		t.Fatalf("the setup's sandbox by id: %v", r)
	}

	// sandboxd dies, and the sandboxes' processes with it.
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = s.cmd.Wait()
	killSandboxProcesses(t, filepath.Join(s.dataDir, "runtime", "gvisor", "runsc"))
	s = restartServer(t, s)

	for _, id := range []string{cmd["sandboxId"].(string), idle["sandboxId"].(string)} {
		sb := s.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil).Body["sandboxes"].([]any)[0].(map[string]any)
		reason, _ := sb["failureReason"].(string)
		if sb["sandboxStatus"] != "failed" || !strings.Contains(reason, "sandboxd restarted") || strings.Contains(reason, "/") {
			t.Fatalf("sandbox whose processes died: %v, want failed with a reason in words", sb)
		}
	}
	// A stopped sandbox has no failure to tell.
	if sb := s.as(k, "GET", "/api/sandboxes?sandbox_id="+setupSandbox, nil).Body["sandboxes"].([]any)[0].(map[string]any); sb["sandboxStatus"] != "stopped" || sb["failureReason"] != nil {
		t.Fatalf("the setup's stopped sandbox: %v", sb)
	}
	r := s.call("GET", "/sandboxes/"+e2bID, map[string]string{"X-API-Key": ek.Key}, nil)
	reason, _ := r.Body["failureReason"].(string)
	if r.Status != 404 || !strings.Contains(reason, "sandboxd restarted") || !strings.Contains(r.Body["message"].(string), reason) {
		t.Fatalf("E2B detail of a failed sandbox: %d %s, want 404 saying why", r.Status, r.Raw)
	}
}

// runscState is what runsc says of container cid under root.
type runscState struct {
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

func stateOf(root, cid string) runscState {
	var st runscState
	if b, err := exec.Command(gvisor.DefaultRunsc(), "--root", root, "state", cid).Output(); err == nil {
		_ = json.Unmarshal(b, &st)
	}
	return st
}

// killSandboxProcesses kills the host process (gVisor's sentry) of every
// container under the runsc root, as the host's OOM killer would, and
// waits until each is gone (its new parent reaps it).
func killSandboxProcesses(t *testing.T, root string) {
	t.Helper()
	out, err := exec.Command(gvisor.DefaultRunsc(), "--root", root, "list", "-quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	for _, cid := range strings.Fields(string(out)) {
		if pid := stateOf(root, cid).Pid; pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		for deadline := time.Now().Add(time.Minute); stateOf(root, cid).Status == "running"; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s still runs after SIGKILL", cid)
			}
		}
	}
}

// TestDegradedRuntimeIsSaid: a server on Debian's 2022 runsc says what it
// lacks, at WARN in its log and in GET /api/health's degraded (status
// still success, no host path); one on the current gVisor says nothing.
// (The fallback itself, from a current runsc that does not boot, is
// TestRunscChoice/fallback of package gvisor: serve cannot be made to
// prefer another binary than the installed one.)
func TestDegradedRuntimeIsSaid(t *testing.T) {
	debian, err := exec.LookPath("runsc")
	if err != nil || debian == gvisor.BundledRunsc {
		t.Skip("Debian's runsc is not installed")
	}
	old := startServer(t, filepath.Join(t.TempDir(), "old.db"), "--runsc", debian)
	h := old.call("GET", "/api/health", nil, nil)
	degraded, _ := h.Body["degraded"].([]any)
	if h.Status != 200 || h.Body["status"] != "success" || len(degraded) == 0 ||
		!strings.Contains(h.Body["runtime"].(string), "20221219") {
		t.Fatalf("health on Debian's runsc: %d %s, want success with degraded", h.Status, h.Raw)
	}
	said := fmt.Sprint(degraded...)
	if !strings.Contains(said, "as old as Debian 12's") || !strings.Contains(said, "pause and fork refuse") || strings.Contains(said, debian) {
		t.Fatalf("degraded %q: want what the 2022 runsc lacks, without its path", said)
	}
	if !strings.Contains(old.logs.String(), `level=WARN msg="gvisor runtime degraded"`) {
		t.Fatal("no WARN line in the log of a degraded server")
	}
	if _, err := os.Stat(gvisor.BundledRunsc); err != nil {
		return // without the current gVisor, every server is degraded
	}
	current := startServer(t, filepath.Join(t.TempDir(), "current.db"))
	if h := current.call("GET", "/api/health", nil, nil); h.Status != 200 || h.Body["degraded"] != nil {
		t.Fatalf("health on the current gVisor: %d %s, want no degraded", h.Status, h.Raw)
	}
}
