package e2e

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestWorkspaceReady: a sandbox that says running has its /workspace
// ready, made without git in the sandbox (issue 37): the first command
// finds a clean clone of the account's main, tracking origin/main, and no
// fetch ever ran in it (a fetch leaves .git/FETCH_HEAD). So for a fresh
// account's sandbox (the clone archive the agent unpacks), for a run's
// sandbox (its preparation again finds the clone at main) and for the
// sandbox restored from the snapshot of that run (at main already).
func TestWorkspaceReady(t *testing.T) {
	s := imageServer(t, filepath.Join(t.TempDir(), "ws.db"))
	a := s.createAccount("ws", false)
	k := s.createKey(a.ID)

	// The account's main has a commit, pushed from here.
	wt := t.TempDir()
	u, _ := url.Parse(s.base + "/git/" + a.ID + ".git")
	u.User = url.UserPassword("x", k.Key)
	if err := os.WriteFile(filepath.Join(wt, "README.md"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "README.md"}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "hello"}, {"push", "-q", u.String(), "main"}} {
		if out, err := exec.Command("git", append([]string{"-C", wt}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}

	const check = `cd /workspace; { test -e .git/FETCH_HEAD && echo fetched || echo unpacked; }; git status --porcelain; git remote get-url origin; git rev-parse --abbrev-ref '@{upstream}'; cat README.md report.md 2>/dev/null; true`
	exec := func(id string) string {
		t.Helper()
		r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", check}})
		if r.Status != 200 {
			t.Fatalf("exec: %d %s", r.Status, r.Raw)
		}
		return fmt.Sprint(r.Body["stdout"])
	}
	ready := "unpacked\nhttp://sandboxd.internal/git/" + a.ID + ".git\norigin/main\nhello\n"

	first := s.createSandbox(k, map[string]any{})
	if got := exec(first["sandboxId"].(string)); got != ready {
		t.Fatalf("a fresh account's sandbox:\n%s\nwant:\n%s", got, ready)
	}

	sb := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", check + "; echo all good > /workspace/report.md"}})
	r := s.waitRun(k, sb["runId"].(string), 3*time.Minute)
	if r.Status != "COMPLETED" || r.Output["branch"] != "main" || r.Output["stdout"] != ready {
		t.Fatalf("run %+v\nwant its output:\n%s", r, ready)
	}
	next := s.createSandbox(k, map[string]any{})
	if got, want := exec(next["sandboxId"].(string)), ready+"all good\n"; got != want {
		t.Fatalf("the sandbox after a run:\n%s\nwant:\n%s", got, want)
	}
}
