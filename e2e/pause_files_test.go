package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPauseFiles: a pause of a sandbox's files alone ({"memory": false})
// ends its processes and keeps its files in the blob store; any use
// resumes it from them (its processes afresh) with its id, its files and
// the rest of its lifetime; it stays paused across a restart of its
// server, and a sandbox created with on_timeout pause-files is paused so
// at its timeout. The event says memory false. REST on gVisor and a
// microVM, the CLI and MCP on gVisor; E2B's pause({keepMemory: false}):
// e2e/e2b/test/autoresume.test.js; another node resumes it:
// TestPauseFilesCluster.
func TestPauseFiles(t *testing.T) {
	t.Run("gvisor", func(t *testing.T) { pauseFilesOn(t, nil, true) })
	t.Run("microvm", func(t *testing.T) {
		if !microVMReady(t) {
			return
		}
		pauseFilesOn(t, []string{"--runtime", "microvm"}, false)
	})
}

func pauseFilesOn(t *testing.T, flags []string, cli bool) {
	dsn := filepath.Join(t.TempDir(), "pausefiles.db")
	s := startServer(t, dsn, flags...)
	acct := s.createAccount("pauser", false)
	k := s.createKey(acct.ID)
	sh := func(sid, script string) string {
		t.Helper()
		return shIn(t, s, k, sid, script)
	}
	pauseFiles := func(sid string) map[string]any {
		t.Helper()
		r := s.as(k, "POST", "/api/sandboxes/"+sid+"/pause", map[string]any{"memory": false})
		if r.Status != 200 {
			t.Fatalf("pause with memory false: %d %s", r.Status, r.Raw)
		}
		sb := r.Body["sandbox"].(map[string]any)
		if sb["sandboxStatus"] != "paused" || sb["pausedFiles"] != true {
			t.Fatalf("paused with its files: %v", sb)
		}
		return sb
	}

	// sleeping says whether a `sleep 1000` runs (the test image has no
	// pgrep).
	const sleeping = `for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null; echo; done | grep -q '^sleep 1000' && echo up || echo gone`
	sid := s.createSandbox(k, map[string]any{"timeout": 600_000})["sandboxId"].(string)
	sh(sid, "mkdir -p /opt/data && echo one > /opt/data/v && (setsid sleep 1000 >/dev/null 2>&1 &)")
	if out := sh(sid, sleeping); out != "up\n" {
		t.Fatalf("the background process before the pause: %q", out)
	}
	pauseFiles(sid)
	if sb := s.apiSandbox(k, sid); sb["pausedFiles"] != true || sb["sandboxStatus"] != "paused" {
		t.Fatalf("get while paused: %v", sb)
	}
	r := s.as(k, "GET", "/api/events?type=sandbox.paused", nil)
	if r.Status != 200 || !strings.Contains(string(r.Raw), `"memory":false`) {
		t.Fatalf("paused event: %d %s", r.Status, r.Raw)
	}
	// An exec resumes it: its files, not its processes.
	if out := sh(sid, "cat /opt/data/v; "+sleeping); out != "one\ngone\n" {
		t.Fatalf("after the resume: %q", out)
	}
	if sb := s.apiSandbox(k, sid); sb["sandboxStatus"] != "running" || sb["pausedFiles"] != nil || sb["timeout"].(float64) < 500_000 {
		t.Fatalf("resumed: %v", sb)
	}
	r = s.as(k, "GET", "/api/events?type=sandbox.resumed", nil)
	if r.Status != 200 || len(r.Body["events"].([]any)) != 1 {
		t.Fatalf("resumed event: %d %s", r.Status, r.Raw)
	}

	// Paused again (its writes since kept), across a restart of the
	// server; an explicit resume after it.
	sh(sid, "echo two >> /opt/data/v")
	pauseFiles(sid)
	s.stop()
	s = startServerIn(t, s.dataDir, dsn, flags...)
	if st, _ := s.sandboxStatus(k, sid); st != "paused" {
		t.Fatalf("after the restart: %s", st)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+sid+"/resume", nil); r.Status != 200 || r.Body["sandbox"].(map[string]any)["sandboxStatus"] != "running" {
		t.Fatalf("resume after the restart: %d %s", r.Status, r.Raw)
	}
	if out := sh(sid, "cat /opt/data/v"); out != "one\ntwo\n" {
		t.Fatalf("after the restart and resume: %q", out)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+sid+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}

	// on_timeout pause-files: paused so at its timeout, then resumed.
	timed := s.createSandbox(k, map[string]any{"timeout": 4000, "on_timeout": "pause-files"})["sandboxId"].(string)
	sh(timed, "mkdir -p /opt && echo kept > /opt/at-timeout")
	deadline := time.Now().Add(60 * time.Second)
	for {
		sb := s.apiSandbox(k, timed)
		if sb["sandboxStatus"] == "paused" && sb["pausedFiles"] == true && sb["onTimeout"] == "pause-files" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not paused with its files at its timeout: %v", sb)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := sh(timed, "cat /opt/at-timeout"); out != "kept\n" {
		t.Fatalf("resumed after its timeout: %q", out)
	}
	if r := s.as(k, "POST", "/api/sandboxes", map[string]any{"on_timeout": "sleep"}); r.Status != 400 || !strings.Contains(string(r.Raw), "on_timeout") {
		t.Fatalf("on_timeout sleep: %d %s", r.Status, r.Raw)
	}
	s.as(k, "POST", "/api/sandboxes/"+timed+"/stop", nil)
	if !cli {
		return
	}

	// The CLI: sandbox pause --memory=false, and a paused sandbox stopped
	// as it is.
	c := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	res := runCLI(t, nil, nil, "sandbox", "pause", "--url", s.base, "--key", k.Key, "--json", "--memory=false", c)
	var paused map[string]any
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &paused) != nil || paused["pausedFiles"] != true {
		t.Fatalf("sandbox pause --memory=false: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+c+"/stop", nil); r.Status != 200 || r.Body["sandbox"].(map[string]any)["sandboxStatus"] != "stopped" {
		t.Fatalf("stop a sandbox paused with its files: %d %s", r.Status, r.Raw)
	}

	// MCP: pause_sandbox with memory false, then resume_sandbox.
	m := s.createSandbox(k, map[string]any{})["sandboxId"].(string)
	sh(m, "mkdir -p /opt && echo mcp > /opt/m")
	mc := s.mcpConnect(k)
	a := mc.call(t, "pause_sandbox", map[string]any{"sandbox_id": m, "memory": false}, "")
	if a.IsError || a.Data["sandbox"].(map[string]any)["pausedFiles"] != true {
		t.Fatalf("pause_sandbox: %+v", a)
	}
	a = mc.call(t, "resume_sandbox", map[string]any{"sandbox_id": m}, "")
	if a.IsError || a.Data["sandbox"].(map[string]any)["sandboxStatus"] != "running" {
		t.Fatalf("resume_sandbox: %+v", a)
	}
	if out := sh(m, "cat /opt/m"); out != "mcp\n" {
		t.Fatalf("after resume_sandbox: %q", out)
	}
	s.as(k, "POST", "/api/sandboxes/"+m+"/stop", nil)
}

// TestPauseFilesCluster: a sandbox paused with its files alone has nothing
// on its node. Two nodes on one PostgreSQL and one S3 store; a sandbox on
// node A writes a file and is paused so through node B's API; A is
// SIGKILLed; once B has declared A down, an exec through B resumes the
// sandbox on B, its file there and its id the same. (A starts again at
// the end, to clean up after the kill.)
func TestPauseFilesCluster(t *testing.T) {
	nodes, st, _ := startTemplateCluster(t, "5s")
	a, b := nodes[0], nodes[1]
	ids := map[*server]string{a.server: nodeIDOf(t, a.server), b.server: nodeIDOf(t, b.server)}
	acct := a.createAccount("mover", false)
	k := a.createKey(acct.ID)

	sid := onlyOn(t, a, ids, ids[a.server], func() string {
		return a.createSandbox(k, map[string]any{})["sandboxId"].(string)
	})
	if r := b.as(k, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "mkdir -p /opt && echo from-node-a > /opt/where"}}); r.Status != 200 {
		t.Fatalf("exec on A through B: %d %s", r.Status, r.Raw)
	}
	if r := b.as(k, "POST", "/api/sandboxes/"+sid+"/pause", map[string]any{"memory": false}); r.Status != 200 {
		t.Fatalf("pause its files through B: %d %s", r.Status, r.Raw)
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := b.as(k, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "cat", "args": []string{"/opt/where"}})
		if r.Status == 200 {
			if r.Body["stdout"] != "from-node-a\n" {
				t.Fatalf("resumed on B: %s", r.Raw)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never resumed on node B: %d %s", r.Status, r.Raw)
		}
		time.Sleep(time.Second)
	}
	if got := nodeOf(t, st, sid); got != ids[b.server] {
		t.Fatalf("sandbox %s is on %s after its resume, not node B", sid, got)
	}
	// Node A back: its start reconciles what the kill left.
	startServerIn(t, a.dataDir, a.dsn, a.flags...)
}

// TestMovedPause: a sandbox paused with its memory on node A is resumed
// by node B after A is SIGKILLed, on gVisor and a microVM (the test's name
// stays short: the sandboxes' sockets live under its temporary directory): its state was saved in the blob
// store with the pause, B adopts the sandbox when it declares A down, and
// the first use through B restores it there — its file, a file in /tmp
// (memory) and a process counting in a shell, which carries on from where
// it was.
func TestMovedPause(t *testing.T) {
	t.Run("gvisor", func(t *testing.T) { pauseMemoryCluster(t) })
	t.Run("microvm", func(t *testing.T) {
		if !microVMReady(t) {
			return
		}
		pauseMemoryCluster(t, "--runtime", "microvm")
	})
}

func pauseMemoryCluster(t *testing.T, flags ...string) {
	nodes, st, _ := startTemplateCluster(t, "5s", flags...)
	a, b := nodes[0], nodes[1]
	ids := map[*server]string{a.server: nodeIDOf(t, a.server), b.server: nodeIDOf(t, b.server)}
	acct := a.createAccount("sleeper", false)
	k := a.createKey(acct.ID)

	sid := onlyOn(t, a, ids, ids[a.server], func() string {
		return a.createSandbox(k, map[string]any{})["sandboxId"].(string)
	})
	exec := func(n *clusterNode, script string) response {
		t.Helper()
		return n.as(k, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
	}
	if r := exec(b, "mkdir -p /opt && echo from-node-a > /opt/where && echo in-memory > /tmp/m && (setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done' >/dev/null 2>&1 &)"); r.Status != 200 {
		t.Fatalf("exec on A through B: %d %s", r.Status, r.Raw)
	}
	time.Sleep(time.Second)
	if r := b.as(k, "POST", "/api/sandboxes/"+sid+"/pause", nil); r.Status != 200 || r.Body["sandbox"].(map[string]any)["sandboxStatus"] != "paused" {
		t.Fatalf("pause through B: %d %s", r.Status, r.Raw)
	}
	row, err := st.GetSandbox(t.Context(), sid)
	if err != nil || row.PausedState == "" {
		t.Fatalf("after the pause: %+v %v; want its state in the blob store", row, err)
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	deadline := time.Now().Add(90 * time.Second)
	var r response
	for {
		r = exec(b, "cat /opt/where /tmp/m /tmp/count")
		if r.Status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never resumed on node B: %d %s", r.Status, r.Raw)
		}
		time.Sleep(time.Second)
	}
	f := strings.Fields(fmt.Sprint(r.Body["stdout"]))
	if len(f) != 3 || f[0] != "from-node-a" || f[1] != "in-memory" {
		t.Fatalf("resumed on B: %s", r.Raw)
	}
	first, _ := strconv.Atoi(f[2])
	time.Sleep(time.Second)
	later := exec(b, "cat /tmp/count")
	if n, _ := strconv.Atoi(strings.TrimSpace(fmt.Sprint(later.Body["stdout"]))); first < 5 || n <= first {
		t.Fatalf("the counter resumed at %d, then %s: want it carried on from before the pause", first, later.Raw)
	}
	if got := nodeOf(t, st, sid); got != ids[b.server] {
		t.Fatalf("sandbox %s is on %s after its resume, not node B", sid, got)
	}
	if row, _ := st.GetSandbox(t.Context(), sid); row.PausedState != "" || row.Pause != "" {
		t.Errorf("after the resume: pause %q, state %q", row.Pause, row.PausedState)
	}
	if r := b.as(k, "POST", "/api/sandboxes/"+sid+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}
	// Node A back: its start destroys what is left of the sandbox there.
	startServerIn(t, a.dataDir, a.dsn, a.flags...)
}
