package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// TestFork: POST /api/sandboxes/{id}/fork on both backends. Each child
// starts from the parent's memory and files at one moment (a shell counting
// in memory counts on in the child from the parent's count), is a sandbox
// of its own (id, key, SANDBOX_ID for what it starts, lifetime), names its
// parent, and goes its own way while the parent runs on; a sandbox's own
// key cannot fork it, another account cannot see it, bad counts are 400,
// a stopped parent is 409, and children outlive their parent. A child of a
// sandbox with a network gets an address of its own (and on a microVM a
// hardware address of its own: the restored guest's link is configured
// anew).
func TestFork(t *testing.T) {
	onBothBackends(t, func(t *testing.T, _ string, flags []string) {
		s := startServer(t, filepath.Join(t.TempDir(), "fork.db"), flags...)
		forkFlow(t, s)
		forkNetwork(t, s)
	})
}

// shIn runs a shell script in sandbox id through the API and returns its
// stdout, failing the test unless it exits 0.
func shIn(t *testing.T, s *server, k key, id, script string) string {
	t.Helper()
	r := s.as(k, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"command": "sh", "args": []string{"-c", script}})
	if r.Status != 200 || r.Body["exitCode"] != 0.0 {
		t.Fatalf("exec %q in %s: %d %s", script, id, r.Status, r.Raw)
	}
	return r.Body["stdout"].(string)
}

func forkFlow(t *testing.T, s *server) {
	a, b := s.createAccount("forker", false), s.createAccount("stranger", false)
	k, bk := s.createKey(a.ID), s.createKey(b.ID)
	id := s.createSandbox(k, map[string]any{"timeout": 300000})["sandboxId"].(string)
	count := func(id string) int {
		t.Helper()
		n, err := strconv.Atoi(strings.TrimSpace(shIn(t, s, k, id, "cat /tmp/count")))
		if err != nil {
			t.Fatalf("count in %s: %v", id, err)
		}
		return n
	}
	shIn(t, s, k, id, `(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &
echo from-parent > /workspace/forked.txt; sleep 1`)
	before := count(id)
	path := "/api/sandboxes/" + id + "/fork"

	securitytest.Attack(t, "api", "code inside a sandbox forks its own sandbox with its key (RECOUP_API_KEY), to start sandboxes its account did not ask for",
		"403: a sandbox's key may not fork")
	inside := key{Key: strings.TrimSpace(shIn(t, s, k, id, `echo "$RECOUP_API_KEY"`))}
	if r := s.as(inside, "POST", path, map[string]any{}); r.Status != 403 {
		t.Fatalf("fork with the sandbox's own key: %d %s", r.Status, r.Raw)
	}
	if r := s.as(bk, "POST", path, map[string]any{}); r.Status != 404 {
		t.Fatalf("fork by another account: %d %s", r.Status, r.Raw)
	}
	for _, body := range []map[string]any{{"count": 0}, {"count": 21}, {"count": "two"}, {"count": 1.5}, {"timeout": -1}} {
		if r := s.as(k, "POST", path, body); r.Status != 400 || r.Body["error"] == nil {
			t.Fatalf("fork with %v: %d %s", body, r.Status, r.Raw)
		}
	}

	start := time.Now()
	r := s.as(k, "POST", path, map[string]any{"count": 2, "timeout": 120000})
	if r.Status != 200 {
		t.Fatalf("fork: %d %s", r.Status, r.Raw)
	}
	t.Logf("fork of 2 through the API: %v", time.Since(start).Round(time.Millisecond))
	kids, _ := r.Body["sandboxes"].([]any)
	if len(kids) != 2 {
		t.Fatalf("fork answered %d sandboxes: %s", len(kids), r.Raw)
	}
	parentKey := strings.TrimSpace(shIn(t, s, k, id, `echo "$RECOUP_API_KEY"`))
	var kidIDs []string
	for _, kv := range kids {
		kid := kv.(map[string]any)
		cid := kid["sandboxId"].(string)
		kidIDs = append(kidIDs, cid)
		if kid["sandboxStatus"] != "running" || kid["forkedFrom"] != id || cid == id {
			t.Fatalf("child: %v", kid)
		}
		if left := kid["timeout"].(float64); left > 120000 || left < 100000 {
			t.Errorf("child's timeout %v, want 120000", left)
		}
		if c := count(cid); c < before {
			t.Errorf("child %s counts %d, the parent had %d before the fork", cid, c, before)
		}
		env := shIn(t, s, k, cid, `cat /workspace/forked.txt; echo "$SANDBOX_ID"; echo "$RECOUP_API_KEY"`)
		lines := strings.Split(strings.TrimSpace(env), "\n")
		if len(lines) != 3 || lines[0] != "from-parent" || lines[1] != cid || lines[2] == parentKey || lines[2] == "" {
			t.Errorf("child %s's file, id and key: %q", cid, env)
		}
	}
	// They go their own ways; the parent runs on.
	shIn(t, s, k, kidIDs[0], "echo mine > /workspace/own.txt")
	if got := shIn(t, s, k, kidIDs[1], "cat /workspace/own.txt 2>/dev/null || echo absent"); got != "absent\n" {
		t.Errorf("a file written in one child is in the other: %q", got)
	}
	if got := shIn(t, s, k, id, "cat /workspace/own.txt 2>/dev/null || echo absent"); got != "absent\n" {
		t.Errorf("a file written in a child is in the parent: %q", got)
	}
	c1 := count(id)
	time.Sleep(300 * time.Millisecond)
	if c2 := count(id); c1 < before || c2 <= c1 {
		t.Errorf("the parent's counter after the fork: %d then %d (before: %d)", c1, c2, before)
	}
	listed := s.as(k, "GET", "/api/sandboxes?sandbox_id="+kidIDs[0], nil)
	if listed.Status != 200 || !strings.Contains(string(listed.Raw), `"forkedFrom":"`+id+`"`) {
		t.Errorf("listed child: %d %s", listed.Status, listed.Raw)
	}

	// Five at once, timed (bench/README.md quotes it).
	start = time.Now()
	if r := s.as(k, "POST", path, map[string]any{"count": 5}); r.Status != 200 {
		t.Fatalf("fork of 5: %d %s", r.Status, r.Raw)
	} else {
		t.Logf("fork of 5 through the API: %v", time.Since(start).Round(time.Millisecond))
		for _, kv := range r.Body["sandboxes"].([]any) {
			cid := kv.(map[string]any)["sandboxId"].(string)
			if c := count(cid); c < before {
				t.Errorf("child %s of the fork of 5 counts %d", cid, c)
			}
			s.as(k, "POST", "/api/sandboxes/"+cid+"/stop", map[string]any{})
		}
	}

	// Children outlive their parent; a stopped parent cannot be forked.
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/stop", map[string]any{}); r.Status != 200 {
		t.Fatalf("stop the parent: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "POST", path, map[string]any{}); r.Status != 409 {
		t.Fatalf("fork of a stopped sandbox: %d %s", r.Status, r.Raw)
	}
	if got := shIn(t, s, k, kidIDs[1], "cat /workspace/forked.txt"); got != "from-parent\n" {
		t.Errorf("a child after its parent stopped: %q", got)
	}
	for _, cid := range kidIDs {
		s.as(k, "POST", "/api/sandboxes/"+cid+"/stop", map[string]any{})
	}
}

// forkNetwork: the child of a sandbox with a network has the parent's
// policy and an address of its own.
func forkNetwork(t *testing.T, s *server) {
	a := s.createAccount("netforker", false)
	k := s.createKey(a.ID)
	id := s.createSandbox(k, map[string]any{"network": "egress"})["sandboxId"].(string)
	addr := func(id string) string {
		t.Helper()
		return strings.TrimSpace(shIn(t, s, k, id, `ip -4 -o addr show eth0 | awk '{print $4}'; ip -o link show eth0 | awk '{for (i = 1; i < NF; i++) if ($i == "link/ether") print $(i+1)}'`))
	}
	parent := addr(id)
	r := s.as(k, "POST", "/api/sandboxes/"+id+"/fork", map[string]any{})
	if r.Status != 200 {
		t.Fatalf("fork a sandbox with a network: %d %s", r.Status, r.Raw)
	}
	kid := r.Body["sandboxes"].([]any)[0].(map[string]any)
	cid := kid["sandboxId"].(string)
	if fmt.Sprint(kid["network"]) != "egress" {
		t.Errorf("child's policy: %v", kid["network"])
	}
	if child := addr(cid); parent == "" || child == "" || child == parent {
		t.Errorf("parent's address %q, child's %q: the child must have its own", parent, child)
	} else if pl, cl := strings.Fields(parent), strings.Fields(child); len(pl) != 2 || len(cl) != 2 || pl[1] == cl[1] {
		t.Errorf("parent's hardware address %q, child's %q: the child must have its own", parent, child)
	}
	if got := addr(id); got != parent {
		t.Errorf("the parent's address changed with the fork: %q, was %q", got, parent)
	}
}
