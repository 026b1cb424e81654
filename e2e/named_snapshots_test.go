package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestNamedSnapshots: a running sandbox's files saved as a named snapshot
// start any number of new sandboxes, each with its own copy; saving the
// name again replaces it while sandboxes of the old one run on; an
// unnamed one is named by its id; a snapshot becomes a template that
// outlives it; a delete waits for its sandboxes; another account can
// neither save, start, read nor delete alice's. Through REST on gVisor
// and a microVM, and through the CLI and MCP on gVisor (the same service
// under each front end). E2B's SDK: e2e/e2b/test/snapshots.test.js; a
// cluster: TestNamedSnapshotCluster.
func TestNamedSnapshots(t *testing.T) {
	t.Run("gvisor", func(t *testing.T) { namedSnapshotsOn(t, nil, true) })
	t.Run("microvm", func(t *testing.T) {
		if !microVMReady(t) {
			return
		}
		namedSnapshotsOn(t, []string{"--runtime", "microvm"}, false)
	})
}

func namedSnapshotsOn(t *testing.T, flags []string, everyFrontEnd bool) {
	s := startServer(t, filepath.Join(t.TempDir(), "snapshots.db"), flags...)
	alice, bob := s.createAccount("alice", false), s.createAccount("bob", false)
	ak, bk := s.createKey(alice.ID), s.createKey(bob.ID)
	exec := func(sid, script string) string {
		t.Helper()
		return shIn(t, s, ak, sid, script)
	}
	snap := func(k key, sid string, body map[string]any) response {
		t.Helper()
		return s.as(k, "POST", "/api/sandboxes/"+sid+"/snapshots", body)
	}

	src := s.createSandbox(ak, map[string]any{})["sandboxId"].(string)
	exec(src, "mkdir -p /data /opt && echo one > /data/v && echo keep > /opt/keep")
	r := snap(ak, src, map[string]any{"name": "work"})
	if r.Status != 200 {
		t.Fatalf("snapshot: %d %s", r.Status, r.Raw)
	}
	first := r.Body["snapshot"].(map[string]any)
	if first["ref"] != "work:latest" || first["sandbox_id"] != src {
		t.Fatalf("snapshot %v", first)
	}
	// The sandbox runs on.
	if out := exec(src, "cat /data/v"); out != "one\n" {
		t.Fatalf("the source after its snapshot: %q", out)
	}

	// Any number of sandboxes, each with its own copy.
	c1 := s.createSandbox(ak, map[string]any{"snapshot": "work"})["sandboxId"].(string)
	c2 := s.createSandbox(ak, map[string]any{"snapshot": first["id"]})["sandboxId"].(string)
	if out := exec(c1, "cat /data/v /opt/keep && echo c1 > /data/v"); out != "one\nkeep\n" {
		t.Fatalf("a sandbox of the snapshot sees %q", out)
	}
	if out := exec(c2, "cat /data/v"); out != "one\n" {
		t.Fatalf("a second sandbox of the snapshot sees %q after the first wrote", out)
	}

	// Bob: not his to save, start, read or delete.
	securitytest.Attack(t, "snapshots", "another account saves alice's sandbox as a snapshot, starts a sandbox from her snapshot, or reads or deletes it",
		"404 each time: the sandbox is loaded under the one access rule, and snapshot names and ids resolve within the caller's account only")
	if r := snap(bk, src, map[string]any{"name": "mine"}); r.Status != 404 {
		t.Fatalf("bob snapshots alice's sandbox: %d %s", r.Status, r.Raw)
	}
	for _, ref := range []string{"work", first["id"].(string)} {
		if r := s.as(bk, "POST", "/api/sandboxes", map[string]any{"snapshot": ref}); r.Status != 404 {
			t.Fatalf("bob starts alice's %s: %d %s", ref, r.Status, r.Raw)
		}
		if r := s.as(bk, "GET", "/api/snapshots/"+ref, nil); r.Status != 404 {
			t.Fatalf("bob reads alice's %s: %d %s", ref, r.Status, r.Raw)
		}
		if r := s.as(bk, "DELETE", "/api/snapshots/"+ref, nil); r.Status != 404 {
			t.Fatalf("bob deletes alice's %s: %d %s", ref, r.Status, r.Raw)
		}
	}

	// The name again: the new files from now on; c1 runs on.
	exec(src, "echo two > /data/v")
	if r := snap(ak, src, map[string]any{"name": "work"}); r.Status != 200 || r.Body["snapshot"].(map[string]any)["id"] == first["id"] {
		t.Fatalf("snapshot again: %d %s", r.Status, r.Raw)
	}
	c3 := s.createSandbox(ak, map[string]any{"snapshot": "work"})["sandboxId"].(string)
	if out := exec(c3, "cat /data/v"); out != "two\n" {
		t.Fatalf("a sandbox of the replaced snapshot sees %q", out)
	}
	if out := exec(c1, "cat /data/v"); out != "c1\n" {
		t.Fatalf("a sandbox of the old snapshot after the replace sees %q", out)
	}
	if r := s.as(ak, "GET", "/api/snapshots", nil); r.Status != 200 || len(r.Body["named"].([]any)) != 1 {
		t.Fatalf("list: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "GET", "/api/templates", nil); r.Status != 200 || len(r.Body["templates"].([]any)) != 0 {
		t.Fatalf("snapshots among the templates: %s", r.Raw)
	}

	// A template of it outlives it; the delete waits for its sandboxes.
	if r := s.as(ak, "POST", "/api/snapshots/work/template", map[string]any{"name": "work-tpl:v1"}); r.Status != 200 {
		t.Fatalf("promote: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "DELETE", "/api/snapshots/work", nil); r.Status != 409 {
		t.Fatalf("delete while c3 runs it: %d %s", r.Status, r.Raw)
	}
	s.as(ak, "POST", "/api/sandboxes/"+c3+"/stop", nil)
	if r := s.as(ak, "DELETE", "/api/snapshots/work", nil); r.Status != 200 {
		t.Fatalf("delete: %d %s", r.Status, r.Raw)
	}
	if r := s.as(ak, "POST", "/api/sandboxes", map[string]any{"snapshot": "work"}); r.Status != 404 || !strings.Contains(string(r.Raw), "snapshot work not found") {
		t.Fatalf("start a deleted snapshot: %d %s", r.Status, r.Raw)
	}
	t1 := s.createSandbox(ak, map[string]any{"template": "work-tpl:v1"})["sandboxId"].(string)
	if out := exec(t1, "cat /data/v"); out != "two\n" {
		t.Fatalf("a sandbox of the promoted template sees %q", out)
	}
	for _, sid := range []string{c1, c2, t1} {
		s.as(ak, "POST", "/api/sandboxes/"+sid+"/stop", nil)
	}
	if !everyFrontEnd {
		return
	}

	// The CLI: unnamed (named by its id), listed, started, removed.
	cli := func(args ...string) string {
		t.Helper()
		r := runCLI(t, nil, nil, append(args[:1:1], append([]string{"--url", s.base, "--key", ak.Key, "--json"}, args[1:]...)...)...)
		if r.code != 0 {
			t.Fatalf("sandboxd %v: %d\n%s\n%s", args, r.code, r.stdout, r.stderr)
		}
		return r.stdout
	}
	var anon map[string]any
	if err := json.Unmarshal([]byte(cli("sandbox", "snapshot", src)), &anon); err != nil || anon["name"] != anon["id"] {
		t.Fatalf("cli snapshot: %v %v", anon, err)
	}
	var listed []map[string]any
	if err := json.Unmarshal([]byte(cli("snapshot", "ls", "--sandbox", src)), &listed); err != nil || len(listed) != 1 || listed[0]["id"] != anon["id"] {
		t.Fatalf("cli ls: %v %v", listed, err)
	}
	var created map[string]any
	if err := json.Unmarshal([]byte(cli("sandbox", "create", "--snapshot", anon["id"].(string), "--wait")), &created); err != nil {
		t.Fatal(err)
	}
	cliSB := created["sandboxId"].(string)
	if out := exec(cliSB, "cat /data/v"); out != "two\n" {
		t.Fatalf("a sandbox the CLI started from a snapshot sees %q", out)
	}
	s.as(ak, "POST", "/api/sandboxes/"+cliSB+"/stop", nil)
	if out := cli("snapshot", "rm", anon["id"].(string)); !strings.Contains(out, anon["id"].(string)) {
		t.Fatalf("cli rm: %s", out)
	}

	// MCP: the same service.
	mc := s.mcpConnect(ak)
	a := mc.call(t, "snapshot_sandbox", map[string]any{"sandbox_id": src, "name": "mcp:v1"}, "")
	if a.IsError || fmt.Sprint(a.Data["snapshot"].(map[string]any)["ref"]) != "mcp:v1" {
		t.Fatalf("snapshot_sandbox: %+v", a)
	}
	a = mc.call(t, "run_command", map[string]any{"command": "cat", "args": []string{"/data/v"}, "snapshot": "mcp:v1"}, "")
	if a.IsError || !strings.Contains(a.Text, `two\n`) {
		t.Fatalf("run_command from a snapshot: %+v", a)
	}
	a = mc.call(t, "list_snapshots", map[string]any{}, "")
	if a.IsError || len(a.Data["snapshots"].([]any)) != 1 {
		t.Fatalf("list_snapshots: %+v", a)
	}
	if a := mc.call(t, "delete_snapshot", map[string]any{"snapshot": "mcp:v1"}, ""); !a.IsError || !strings.Contains(a.Text, "in use") {
		t.Fatalf("delete_snapshot while run_command's sandbox runs it: %+v", a)
	}
	bobMCP := s.mcpConnect(bk)
	if a := bobMCP.call(t, "delete_snapshot", map[string]any{"snapshot": "mcp:v1"}, ""); !a.IsError || !strings.Contains(a.Text, "not found") {
		t.Fatalf("bob's delete_snapshot: %+v", a)
	}
}

// TestNamedSnapshotCluster: a named snapshot lives in the blob store, not
// on the node that took it. Two nodes on one PostgreSQL and one S3 store;
// a sandbox placed on node A writes a file and is snapshotted through node
// B's API (forwarded to A, whose runtime captures it); A is SIGKILLed;
// sandboxes from the snapshot start on B, twice, with the file. (A starts
// again at the end, to clean up after the kill.)
func TestNamedSnapshotCluster(t *testing.T) {
	nodes, st, _ := startTemplateCluster(t, "5s")
	a, b := nodes[0], nodes[1]
	ids := map[*server]string{a.server: nodeIDOf(t, a.server), b.server: nodeIDOf(t, b.server)}
	acct := a.createAccount("snapper", false)
	k := a.createKey(acct.ID)

	src := onlyOn(t, a, ids, ids[a.server], func() string {
		return a.createSandbox(k, map[string]any{})["sandboxId"].(string)
	})
	if nodeOf(t, st, src) != ids[a.server] {
		t.Fatalf("the source is on %s, not node A", nodeOf(t, st, src))
	}
	if r := b.as(k, "POST", "/api/sandboxes/"+src+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "mkdir -p /opt && echo from-node-a > /opt/where"}}); r.Status != 200 {
		t.Fatalf("exec on A through B: %d %s", r.Status, r.Raw)
	}
	if r := b.as(k, "POST", "/api/sandboxes/"+src+"/snapshots", map[string]any{"name": "moved"}); r.Status != 200 {
		t.Fatalf("snapshot through B: %d %s", r.Status, r.Raw)
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	for range 2 {
		sid := onlyOn(t, b, ids, ids[b.server], func() string {
			return b.createSandbox(k, map[string]any{"snapshot": "moved"})["sandboxId"].(string)
		})
		if nodeOf(t, st, sid) != ids[b.server] {
			t.Fatalf("sandbox %s is on %s, not node B", sid, nodeOf(t, st, sid))
		}
		r := b.as(k, "POST", "/api/sandboxes/"+sid+"/exec", map[string]any{"command": "cat", "args": []string{"/opt/where"}})
		if r.Status != 200 || r.Body["stdout"] != "from-node-a\n" {
			t.Fatalf("a sandbox of the snapshot on node B: %d %s", r.Status, r.Raw)
		}
	}
	// Node A back: its start reconciles what the kill left (the source's
	// runtime sandbox, which would hold the test's directory).
	startServerIn(t, a.dataDir, a.dsn, a.flags...)
}
