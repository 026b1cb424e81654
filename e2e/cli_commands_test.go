package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// cliResult is what one run of the binary printed and its exit status.
type cliResult struct {
	stdout, stderr string
	code           int
}

// runCLI runs the sandboxd binary as a user would, with stdin (nil: none,
// as from /dev/null) and extra environment.
func runCLI(t *testing.T, stdin io.Reader, env []string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	cmd.Env = append(os.Environ(), env...)
	err := cmd.Run()
	var exit *exec.ExitError
	res := cliResult{stdout: out.String(), stderr: errb.String()}
	switch {
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("sandboxd %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// sandboxCLI runs `sandboxd sandbox ARGS` against s with k.
func sandboxCLI(t *testing.T, s *server, k key) func(stdin io.Reader, args ...string) cliResult {
	return func(stdin io.Reader, args ...string) cliResult {
		t.Helper()
		return runCLI(t, stdin, nil, append([]string{"sandbox", "--url", s.base, "--key", k.Key}, args...)...)
	}
}

// TestCLICommandTree: typos and missing commands fail with a suggestion
// instead of printing help and succeeding; version and errors speak JSON
// when asked.
func TestCLICommandTree(t *testing.T) {
	for _, args := range [][]string{{"sandbox", "lsit"}, {"admin", "account", "ls"}, {"sandbox", "logz"}} {
		r := runCLI(t, nil, nil, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "Did you mean this?") {
			t.Errorf("sandboxd %s: exit %d, stderr %q; want non-zero and a suggestion", strings.Join(args, " "), r.code, r.stderr)
		}
	}
	if r := runCLI(t, nil, nil, "sandbox", "logs"); r.code == 0 || !strings.Contains(r.stderr, "accepts 1 arg") {
		t.Errorf("sandbox logs without a run: exit %d, %q", r.code, r.stderr)
	}
	r := runCLI(t, nil, nil, "version", "--json")
	var v struct{ Version string }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || v.Version == "" {
		t.Errorf("version --json: exit %d, %q", r.code, r.stdout)
	}
	if r := runCLI(t, nil, nil, "sandbox", "exec", "--help"); strings.Contains(r.stdout, "--data-dir") || !strings.Contains(r.stdout, "Examples:") {
		t.Errorf("sandbox exec --help:\n%s", r.stdout)
	}

	s := startServer(t, storetest.SQLiteDSN(t))
	k := s.createKey(s.createAccount("cli-tree", false).ID)
	cli := sandboxCLI(t, s, k)
	r = cli(nil, "inspect", "--json", "sbx_unknown")
	if r.code != 1 || strings.TrimSpace(r.stderr) != `{"error":"Sandbox not found","status":404}` {
		t.Errorf("inspect --json of an unknown sandbox: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, []string{"SANDBOXD_JSON=true"}, "sandbox", "--url", s.base, "--key", k.Key, "stop", "sbx_unknown")
	if r.code != 1 || strings.TrimSpace(r.stderr) != `{"error":"Sandbox not found","status":404}` {
		t.Errorf("SANDBOXD_JSON=true stop of an unknown sandbox: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestCLIRuns: a run whose command fails is a failure: create --follow and
// logs show its output and exit with its status; create --wait returns a
// running sandbox.
func TestCLIRuns(t *testing.T) {
	s := startServer(t, storetest.SQLiteDSN(t))
	k := s.createKey(s.createAccount("cli-runs", false).ID)
	cli := sandboxCLI(t, s, k)

	r := cli(nil, "create", "--follow", "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out\n" || !strings.Contains(r.stderr, "err\n") || !strings.Contains(r.stderr, "its command exited with status 3") {
		t.Fatalf("create --follow: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	run := strings.Fields(r.stderr[strings.Index(r.stderr, "its run ")+len("its run "):])[0]

	r = cli(nil, "logs", run)
	if r.code != 3 || r.stdout != "out\n" || !strings.Contains(r.stderr, "err\n") {
		t.Fatalf("logs %s: exit %d, stdout %q, stderr %q", run, r.code, r.stdout, r.stderr)
	}
	r = cli(nil, "logs", "--json", run)
	var rec map[string]any
	if r.code != 3 || json.Unmarshal([]byte(r.stdout), &rec) != nil || rec["status"] != "COMPLETED" || rec["output"].(map[string]any)["exitCode"] != 3.0 {
		t.Fatalf("logs --json: exit %d, %q", r.code, r.stdout)
	}
	r = cli(nil, "create", "--follow", "--", "sh", "-c", "echo fine")
	if r.code != 0 || r.stdout != "fine\n" {
		t.Fatalf("create --follow of a command that succeeds: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = cli(nil, "create", "--follow", "--", "no-such-command")
	if r.code == 0 || !strings.Contains(r.stderr, "FAILED") {
		t.Fatalf("create --follow of a missing command: exit %d, stderr %q", r.code, r.stderr)
	}

	r = cli(nil, "create", "--wait", "--json")
	var sb map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sb) != nil || sb["sandboxStatus"] != "running" {
		t.Fatalf("create --wait --json: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestCLISandboxCommands: exec with input, a timeout and --json's exit
// status; timeout and extend; inspect; ls's filters; rm.
func TestCLISandboxCommands(t *testing.T) {
	s := startServer(t, storetest.SQLiteDSN(t))
	k := s.createKey(s.createAccount("cli-commands", false).ID)
	cli := sandboxCLI(t, s, k)
	id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)

	if r := cli(strings.NewReader("hello\nworld\n"), "exec", id, "--", "tr", "a-z", "A-Z"); r.code != 0 || r.stdout != "HELLO\nWORLD\n" {
		t.Errorf("exec with piped input: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r := cli(strings.NewReader("whole"), "exec", "--json", id, "--", "sh", "-c", "cat; exit 4")
	var ex map[string]any
	if r.code != 4 || json.Unmarshal([]byte(r.stdout), &ex) != nil || ex["stdout"] != "whole" || ex["exitCode"] != 4.0 {
		t.Errorf("exec --json with input: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// Input that never ends does not hold a command that does not read it.
	open, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	defer open.Close()
	if r := cli(open, "exec", "--json", id, "--", "echo", "done"); r.code != 0 || !strings.Contains(r.stdout, `"stdout": "done\n"`) {
		t.Errorf("exec --json with input that never ends: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := cli(nil, "exec", "--timeout", "1s", id, "--", "sleep", "60"); r.code != 137 || !strings.Contains(r.stderr, "ran past its --timeout (1s)") {
		t.Errorf("exec --timeout: exit %d, stderr %q", r.code, r.stderr)
	}
	r = cli(nil, "exec", "--json", "--timeout", "1s", id, "--", "sleep", "60")
	if r.code != 137 || json.Unmarshal([]byte(r.stdout), &ex) != nil || ex["timedOut"] != true {
		t.Errorf("exec --json --timeout: exit %d, %q", r.code, r.stdout)
	}

	r = cli(nil, "timeout", "--json", id, "2h")
	var sb map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sb) != nil || sb["timeout"].(float64) <= float64(time.Hour/time.Millisecond) {
		t.Errorf("timeout 2h: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	r = cli(nil, "extend", "--json", id, "1h")
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sb) != nil || sb["timeout"].(float64) <= float64(2*time.Hour/time.Millisecond) {
		t.Errorf("extend 1h: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}

	r = cli(nil, "inspect", id)
	if r.code != 0 || !strings.Contains(r.stdout, "sandboxId      "+id+"\n") || !strings.Contains(r.stdout, "sandboxStatus  running\n") || !strings.Contains(r.stdout, "runtime ") {
		t.Errorf("inspect: exit %d:\n%s%s", r.code, r.stdout, r.stderr)
	}
	api := s.as(k, "GET", "/api/sandboxes?sandbox_id="+id, nil).Body["sandboxes"].([]any)[0].(map[string]any)
	r = cli(nil, "get", "--json", id)
	var got map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || len(got) != len(api) || got["sandboxId"] != id {
		t.Errorf("get --json: %q, want every field of %v", r.stdout, api)
	}

	// A stopped sandbox leaves the default list, stays in --all and
	// --status, and goes with rm; a running one needs --force.
	stopped := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	if r := cli(nil, "stop", stopped); r.code != 0 {
		t.Fatalf("stop: %d %s", r.code, r.stderr)
	}
	if r := cli(nil, "ls"); strings.Contains(r.stdout, stopped) || !strings.Contains(r.stdout, id) || !strings.Contains(r.stderr, "1 stopped or failed sandbox not shown") {
		t.Errorf("ls:\n%s%s", r.stdout, r.stderr)
	}
	for _, args := range [][]string{{"ls", "--all"}, {"ls", "--status", "stopped"}} {
		if r := cli(nil, args...); !strings.Contains(r.stdout, stopped) {
			t.Errorf("%s:\n%s", strings.Join(args, " "), r.stdout)
		}
	}
	if r := cli(nil, "ls", "--status", "stopped"); strings.Contains(r.stdout, id) {
		t.Errorf("ls --status stopped lists the running sandbox:\n%s", r.stdout)
	}
	if r := cli(nil, "rm", id); r.code != 1 || !strings.Contains(r.stderr, "stop it before deleting it") {
		t.Errorf("rm of a running sandbox: exit %d, %q", r.code, r.stderr)
	}
	if r := cli(nil, "rm", "--all-stopped"); r.code != 0 || r.stdout != stopped+"\n" {
		t.Errorf("rm --all-stopped: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := cli(nil, "rm", "--force", id); r.code != 0 || r.stdout != id+"\n" {
		t.Errorf("rm --force: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	for _, gone := range []string{id, stopped} {
		if r := s.as(k, "GET", "/api/sandboxes?sandbox_id="+gone, nil); len(r.Body["sandboxes"].([]any)) != 0 {
			t.Errorf("%s is still listed after rm: %s", gone, r.Raw)
		}
	}
}

// TestCLICopy: a directory copied into a sandbox and back out arrives
// whole (files, modes, an empty directory); a file goes into an existing
// directory under its own name; the archive itself can go to stdout.
func TestCLICopy(t *testing.T) {
	s := startServer(t, storetest.SQLiteDSN(t))
	k := s.createKey(s.createAccount("cli-copy", false).ID)
	cli := sandboxCLI(t, s, k)
	id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)

	local := t.TempDir()
	src := filepath.Join(local, "proj")
	for name, content := range map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "bin/run": "#!/bin/sh\necho ran\n"} {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(src, "bin", "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(src, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}

	if r := cli(nil, "cp", src, id+":/tmp/proj"); r.code != 0 || !strings.Contains(r.stderr, "copied 3 files") {
		t.Fatalf("cp in: exit %d, %q", r.code, r.stderr)
	}
	if r := cli(nil, "exec", id, "--", "sh", "-c", "cat /tmp/proj/a.txt /tmp/proj/sub/b.txt && /tmp/proj/bin/run && test -d /tmp/proj/empty"); r.code != 0 || r.stdout != "alpha\nbeta\nran\n" {
		t.Fatalf("the copy in the sandbox: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	// Into an existing directory: under its own name.
	if r := cli(nil, "cp", filepath.Join(src, "a.txt"), id+":/tmp/proj/sub"); r.code != 0 {
		t.Fatalf("cp a file into a directory: exit %d, %q", r.code, r.stderr)
	}

	back := filepath.Join(local, "back")
	if r := cli(nil, "cp", id+":/tmp/proj", back); r.code != 0 {
		t.Fatalf("cp out: exit %d, %q", r.code, r.stderr)
	}
	for name, want := range map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "sub/a.txt": "alpha\n", "bin/run": "#!/bin/sh\necho ran\n"} {
		if got, err := os.ReadFile(filepath.Join(back, name)); err != nil || string(got) != want {
			t.Errorf("back/%s: %q %v", name, got, err)
		}
	}
	if fi, err := os.Stat(filepath.Join(back, "bin", "run")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("back/bin/run: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(back, "empty")); err != nil || !fi.IsDir() {
		t.Errorf("back/empty: %v %v", fi, err)
	}

	r := cli(nil, "cp", id+":/tmp/proj/sub", "-")
	if r.code != 0 || !strings.Contains(r.stdout, "sub/b.txt") {
		t.Errorf("cp out to stdout: exit %d, %q", r.code, r.stderr)
	}
	if r := cli(nil, "cp", id+":/tmp/nothing", local); r.code != 1 || !strings.Contains(r.stderr, "No such file or directory in the sandbox: /tmp/nothing") {
		t.Errorf("cp of a missing path: exit %d, %q", r.code, r.stderr)
	}
}

// TestCLICompletion: the shell completes sandbox ids from the API.
func TestCLICompletion(t *testing.T) {
	s := startServer(t, storetest.SQLiteDSN(t))
	k := s.createKey(s.createAccount("cli-complete", false).ID)
	id := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	r := runCLI(t, nil, []string{"SANDBOXD_URL=" + s.base, "SANDBOXD_API_KEY=" + k.Key}, "__complete", "sandbox", "exec", "")
	if r.code != 0 || !strings.Contains(r.stdout, id+"\trunning\n") {
		t.Errorf("completion: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, nil, nil, "completion", "bash"); r.code != 0 || !strings.Contains(r.stdout, "__start_sandboxd") {
		t.Errorf("completion bash: exit %d", r.code)
	}
}
