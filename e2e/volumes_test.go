package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestVolumes: an account's volume outlives its sandboxes. A sandbox
// mounts it read-write and writes; while it runs, a second writer or a
// reader is refused (409), and so are the volume's delete and resize and
// the sandbox's fork; once it stopped, two sandboxes read it at once,
// read-only (a write fails); a resize grows it for the next writer; a
// fork copies its data; a pause of the sandbox's files and a pause with
// its memory keep it mounted; a restart of the server keeps its data;
// deleted, it is gone. REST on gVisor and a microVM; the CLI on gVisor.
// Another node reads it: TestVolumesCluster. E2B's volumeMounts:
// e2e/e2b/test/volumes.test.js.
func TestVolumes(t *testing.T) {
	t.Run("gvisor", func(t *testing.T) { volumesOn(t, nil) })
	t.Run("microvm", func(t *testing.T) {
		if !microVMReady(t) {
			return
		}
		volumesOn(t, []string{"--runtime", "microvm"})
	})
}

func volumesOn(t *testing.T, flags []string) {
	dsn := filepath.Join(t.TempDir(), "volumes.db")
	s := startServer(t, dsn, flags...)
	acct := s.createAccount("keeper", false)
	k := s.createKey(acct.ID)
	sh := func(sid, script string) string {
		t.Helper()
		return shIn(t, s, k, sid, script)
	}
	want := func(r response, status int, what string) response {
		t.Helper()
		if r.Status != status {
			t.Fatalf("%s: %d %s, want %d", what, r.Status, r.Raw, status)
		}
		return r
	}
	mount := func(name, path string, ro bool) map[string]any {
		return map[string]any{"volumes": []map[string]any{{"name": name, "path": path, "read_only": ro}}}
	}
	stop := func(sid string) { want(s.as(k, "POST", "/api/sandboxes/"+sid+"/stop", nil), 200, "stop "+sid) }

	vol := want(s.as(k, "POST", "/api/volumes", map[string]any{"name": "data", "size_mb": 128}), 200, "create a volume").Body["volume"].(map[string]any)
	if vol["name"] != "data" || vol["size_mb"] != 128.0 || !strings.HasPrefix(vol["id"].(string), "vol_") {
		t.Fatalf("created: %v", vol)
	}
	want(s.as(k, "POST", "/api/volumes", map[string]any{"name": "data"}), 409, "a second volume called data")
	want(s.as(k, "POST", "/api/sandboxes", mount("nope", "/data", false)), 404, "a sandbox on a missing volume")
	want(s.as(k, "POST", "/api/sandboxes", mount("data", "/proc/data", false)), 400, "a volume over /proc")

	w := s.createSandbox(k, mount("data", "/data", false))["sandboxId"].(string)
	sh(w, "echo kept > /data/note && mkdir -p /data/sub && echo deep > /data/sub/f && sync")
	if got := sh(w, "grep ' /data ' /proc/mounts | grep -c nosuid; df -k /data | tail -n 1 | awk '{print $2}'"); !strings.HasPrefix(got, "1\n") {
		t.Errorf("the volume's mount: %q, want nosuid", got)
	}
	r := want(s.as(k, "POST", "/api/sandboxes", mount("data", "/data", false)), 409, "a second writer")
	if !strings.Contains(string(r.Raw), w) {
		t.Errorf("the refusal names no holder: %s", r.Raw)
	}
	want(s.as(k, "POST", "/api/sandboxes", mount("data", "/data", true)), 409, "a reader beside the writer")
	want(s.as(k, "DELETE", "/api/volumes/data", nil), 409, "delete while attached")
	want(s.as(k, "PATCH", "/api/volumes/data", map[string]any{"size_mb": 256}), 409, "resize while attached")
	want(s.as(k, "POST", "/api/sandboxes/"+w+"/fork", map[string]any{}), 409, "fork a sandbox with a volume")
	got := want(s.as(k, "GET", "/api/volumes/data", nil), 200, "get").Body["volume"].(map[string]any)
	if atts := got["attachments"].([]any); len(atts) != 1 || atts[0].(map[string]any)["sandbox_id"] != w {
		t.Errorf("attachments while written: %v", got)
	}

	// Paused with its files, then resumed: the volume is mounted again,
	// its data there (and the lease kept meanwhile).
	want(s.as(k, "POST", "/api/sandboxes/"+w+"/pause", map[string]any{"memory": false}), 200, "pause files")
	want(s.as(k, "POST", "/api/sandboxes", mount("data", "/data", true)), 409, "a reader while the writer is paused")
	if got := sh(w, "cat /data/note; echo more >> /data/note"); got != "kept\n" {
		t.Errorf("after a files pause: %q", got)
	}
	// With its memory: the mount stays (a microVM's disk is opened
	// again), the process sees it.
	want(s.as(k, "POST", "/api/sandboxes/"+w+"/pause", nil), 200, "pause")
	if got := sh(w, "cat /data/note"); got != "kept\nmore\n" {
		t.Errorf("after a memory pause: %q", got)
	}
	stop(w)

	r1 := s.createSandbox(k, mount("data", "/mnt/data", true))["sandboxId"].(string)
	r2 := s.createSandbox(k, mount("data", "/srv/v", true))["sandboxId"].(string)
	if got := sh(r1, "cat /mnt/data/note /mnt/data/sub/f"); got != "kept\nmore\ndeep\n" {
		t.Errorf("reader 1: %q", got)
	}
	if got := sh(r2, "cat /srv/v/note"); got != "kept\nmore\n" {
		t.Errorf("reader 2: %q", got)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+r1+"/exec", map[string]any{"command": "sh", "args": []string{"-c", "echo x > /mnt/data/x"}}); r.Status != 200 || r.Body["exitCode"] == 0.0 {
		t.Errorf("a write to a read-only mount: %d %s", r.Status, r.Raw)
	}
	want(s.as(k, "POST", "/api/sandboxes", mount("data", "/data", false)), 409, "a writer beside readers")
	fork := want(s.as(k, "POST", "/api/volumes/data/fork", map[string]any{"name": "copy"}), 200, "fork while read").Body["volume"].(map[string]any)
	if fork["forked_from"] != vol["id"] {
		t.Errorf("fork: %v", fork)
	}
	stop(r1)
	stop(r2)

	// Grown, then written again: the file system has the new size.
	if v := want(s.as(k, "PATCH", "/api/volumes/data", map[string]any{"size_mb": 256}), 200, "resize").Body["volume"].(map[string]any); v["size_mb"] != 256.0 {
		t.Errorf("resized: %v", v)
	}
	want(s.as(k, "PATCH", "/api/volumes/data", map[string]any{"size_mb": 128}), 400, "shrink")
	w = s.createSandbox(k, mount("data", "/data", false))["sandboxId"].(string)
	kb := sh(w, "echo changed > /data/note; df -k /data | tail -n 1 | awk '{print $2}'")
	if n := atoiE2E(t, strings.TrimSpace(kb)); n < 200<<10 {
		t.Errorf("after the resize to 256 MiB the volume has %d KiB", n)
	}
	stop(w)

	// The fork kept the data as it was; the server's restart keeps both.
	s.stop()
	s = startServerIn(t, s.dataDir, dsn, flags...)
	c := s.createSandbox(k, map[string]any{"volumes": []map[string]any{{"name": "copy", "path": "/c"}, {"name": "data", "path": "/d", "read_only": true}}})["sandboxId"].(string)
	if got := shIn(t, s, k, c, "cat /c/note /d/note"); got != "kept\nmore\nchanged\n" {
		t.Errorf("after a restart, the fork and the volume: %q", got)
	}
	want(s.as(k, "POST", "/api/sandboxes/"+c+"/stop", nil), 200, "stop")

	list := want(s.as(k, "GET", "/api/volumes", nil), 200, "list").Body["volumes"].([]any)
	if len(list) != 2 {
		t.Errorf("list: %v", list)
	}
	want(s.as(k, "DELETE", "/api/volumes/data", nil), 200, "delete")
	want(s.as(k, "GET", "/api/volumes/data", nil), 404, "get after delete")
	if flags == nil {
		volumesCLIAndMCP(t, s, k)
	}
	other := s.createKey(s.createAccount("stranger", false).ID)
	want(s.as(other, "GET", "/api/volumes/copy", nil), 404, "another account's volume")
	want(s.as(other, "POST", "/api/sandboxes", mount("copy", "/c", true)), 404, "another account's volume in a create")
}

// volumesCLIAndMCP: the CLI's volume commands and sandbox create --volume,
// and MCP's volume tools with run_command's volumes.
func volumesCLIAndMCP(t *testing.T, s *server, k key) {
	cli := func(args ...string) cliResult {
		t.Helper()
		return runCLI(t, nil, nil, append(args, "--url", s.base, "--key", k.Key)...)
	}
	decode := func(res cliResult, what string) map[string]any {
		t.Helper()
		var v map[string]any
		if res.code != 0 || json.Unmarshal([]byte(res.stdout), &v) != nil {
			t.Fatalf("%s: exit %d\n%s\n%s", what, res.code, res.stdout, res.stderr)
		}
		return v
	}
	if v := decode(cli("volume", "create", "clivol", "--size-mb", "64", "--json"), "volume create"); v["name"] != "clivol" || v["size_mb"] != 64.0 {
		t.Fatalf("volume create: %v", v)
	}
	sid, _ := decode(cli("sandbox", "create", "--volume", "clivol:/v", "--json"), "sandbox create --volume")["sandboxId"].(string)
	if sid == "" {
		t.Fatal("sandbox create --volume answered no sandbox")
	}
	shIn(t, s, k, sid, "echo via-cli > /v/x")
	if res := cli("volume", "ls"); res.code != 0 || !strings.Contains(res.stdout, "clivol") || !strings.Contains(res.stdout, sid+":/v") {
		t.Errorf("volume ls: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if res := cli("volume", "rm", "clivol"); res.code == 0 || !strings.Contains(res.stderr, "attached") {
		t.Errorf("volume rm while attached: %d %s %s", res.code, res.stdout, res.stderr)
	}
	if res := cli("sandbox", "create", "--volume", "clivol"); res.code == 0 {
		t.Errorf("sandbox create --volume without a path: %d %s", res.code, res.stdout)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+sid+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}
	if v := decode(cli("volume", "fork", "clivol", "clicopy", "--json"), "volume fork"); v["name"] != "clicopy" {
		t.Errorf("volume fork: %v", v)
	}
	if v := decode(cli("volume", "resize", "clicopy", "--size-mb", "128", "--json"), "volume resize"); v["size_mb"] != 128.0 {
		t.Errorf("volume resize: %v", v)
	}
	if res := cli("volume", "rm", "clivol", "clicopy"); res.code != 0 {
		t.Errorf("volume rm: %d %s %s", res.code, res.stdout, res.stderr)
	}

	mc := s.mcpConnect(k)
	if a := mc.call(t, "create_volume", map[string]any{"name": "mcpvol", "size_mb": 64}, ""); a.IsError {
		t.Fatalf("create_volume: %+v", a)
	}
	a := mc.call(t, "run_command", map[string]any{"command": "sh", "args": []string{"-c", "echo via-mcp > /m/x && cat /m/x"},
		"volumes": []map[string]any{{"name": "mcpvol", "path": "/m"}}}, "")
	if a.IsError || !strings.Contains(a.Text, "via-mcp") {
		t.Fatalf("run_command with a volume: %+v", a)
	}
	if a := mc.call(t, "list_volumes", map[string]any{}, ""); a.IsError || !strings.Contains(a.Text, "mcpvol") {
		t.Errorf("list_volumes: %+v", a)
	}
	if a := mc.call(t, "delete_volume", map[string]any{"name": "nope"}, ""); !a.IsError {
		t.Errorf("delete_volume of a missing volume: %+v", a)
	}
}

func atoiE2E(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("not a number: %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// TestVolumesCluster: a volume follows its sandboxes between nodes through
// the blob store. Written on node A, it is read on node B; written on B,
// it is read on A. A node that dies while a sandbox writes a volume there
// loses what was written since the volume's last sync: once the node is
// declared down the volume is free again, at its last synced data.
func TestVolumesCluster(t *testing.T) {
	nodes, _, _ := startTemplateCluster(t, "5s")
	a, b := nodes[0], nodes[1]
	ids := map[*server]string{a.server: nodeIDOf(t, a.server), b.server: nodeIDOf(t, b.server)}
	acct := a.createAccount("traveller", false)
	k := a.createKey(acct.ID)
	if r := a.as(k, "POST", "/api/volumes", map[string]any{"name": "data", "size_mb": 1024}); r.Status != 200 {
		t.Fatalf("create a volume: %d %s", r.Status, r.Raw)
	}
	on := func(n *clusterNode, ro bool) string {
		t.Helper()
		return onlyOn(t, a, ids, ids[n.server], func() string {
			return n.createSandbox(k, map[string]any{"volumes": []map[string]any{{"name": "data", "path": "/data", "read_only": ro}}})["sandboxId"].(string)
		})
	}
	stop := func(n *clusterNode, sid string) {
		t.Helper()
		if r := n.as(k, "POST", "/api/sandboxes/"+sid+"/stop", nil); r.Status != 200 {
			t.Fatalf("stop: %d %s", r.Status, r.Raw)
		}
	}
	sid := on(a, false)
	shIn(t, a.server, k, sid, "echo from-a > /data/note && dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null && sha256sum /data/blob > /data/sum")
	stop(a, sid)

	sid = on(b, false)
	if got := shIn(t, b.server, k, sid, "cat /data/note; cd /data && sha256sum -c sum >/dev/null && echo intact"); got != "from-a\nintact\n" {
		t.Fatalf("read on B: %q", got)
	}
	shIn(t, b.server, k, sid, "echo from-b >> /data/note")
	stop(b, sid)

	sid = on(a, true)
	if got := shIn(t, a.server, k, sid, "cat /data/note"); got != "from-a\nfrom-b\n" {
		t.Fatalf("read back on A: %q", got)
	}
	stop(a, sid)

	// A writer on A; A dies before its sandbox ends: the volume waits
	// for A to be declared down, then B takes it at its last sync.
	sid = on(a, false)
	shIn(t, a.server, k, sid, "echo lost-with-a >> /data/note && sync")
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	deadline := time.Now().Add(90 * time.Second)
	for {
		r := b.as(k, "POST", "/api/sandboxes", map[string]any{"volumes": []map[string]any{{"name": "data", "path": "/data", "read_only": true}}})
		if r.Status == 200 {
			sid = r.Body["sandboxes"].([]any)[0].(map[string]any)["sandboxId"].(string)
			break
		}
		if r.Status != 409 || time.Now().After(deadline) {
			t.Fatalf("attach after A went down: %d %s", r.Status, r.Raw)
		}
		time.Sleep(time.Second)
	}
	if got := shIn(t, b.server, k, sid, "cat /data/note"); got != "from-a\nfrom-b\n" {
		t.Fatalf("after A went down: %q, want the last synced data", got)
	}
	stop(b, sid)
	// Node A back: its start reconciles what the kill left.
	startServerIn(t, a.dataDir, a.dsn, a.flags...)
}
