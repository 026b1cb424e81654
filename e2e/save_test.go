package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
)

// onEveryRuntime runs fn as one subtest per runtime a sandbox may run on:
// gVisor on the current runsc, gVisor on Debian's December 2022 runsc
// (the fallback, which differs most: see the gvisor package), and
// microVMs ("current", "debian", "microvm"); flags are the serve flags
// that pick it. A runtime this host
// lacks is skipped, or fails the test under SANDBOXD_REQUIRE_RUNTIME=1
// (microVMs: SANDBOXD_REQUIRE_MICROVM=1).
func onEveryRuntime(t *testing.T, fn func(t *testing.T, name string, flags []string)) {
	debian, _ := exec.LookPath("runsc")
	for _, rt := range []struct {
		name, runsc string
		flags       []string
	}{
		{"current", gvisor.BundledRunsc, []string{"--runsc", gvisor.BundledRunsc}},
		{"debian", debian, []string{"--runsc", debian}},
		{"microvm", "", []string{"--runtime", "microvm"}},
	} {
		t.Run(rt.name, func(t *testing.T) {
			switch {
			case rt.name == "microvm":
				if !microVMReady(t) {
					return
				}
			case rt.runsc == "" || !executable(rt.runsc) || (rt.name == "debian" && sameFile(rt.runsc, gvisor.BundledRunsc)):
				why := "no " + rt.name + " runsc on this host (scripts/install-runsc.sh, apt-get install runsc)"
				if os.Getenv("SANDBOXD_REQUIRE_RUNTIME") == "1" {
					t.Fatal(why + " (SANDBOXD_REQUIRE_RUNTIME=1)")
				}
				t.Skip(why)
			}
			fn(t, rt.name, rt.flags)
		})
	}
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}

// TestSaveEverywhere: pause and fork work on every runtime, the fallback
// runsc included. Right after a create they wait for sandboxd's own work
// in the sandbox (the clone of /workspace from sandboxd.internal) rather
// than cut it off or being refused over its connection; a fork leaves its
// parent running where it was and makes a running child; a paused parent
// forks too. A socket a runsc cannot save is a 409 naming it readably,
// the sandbox running on as it was; the others save it.
func TestSaveEverywhere(t *testing.T) {
	onEveryRuntime(t, func(t *testing.T, name string, flags []string) {
		s := imageServer(t, filepath.Join(t.TempDir(), "save.db"), flags...)
		k := s.createKey(s.createAccount("saver", false).ID)
		act := func(id, what string) response {
			t.Helper()
			return s.as(k, "POST", "/api/sandboxes/"+id+"/"+what, map[string]any{})
		}
		must := func(r response, what string) response {
			t.Helper()
			if r.Status != 200 {
				t.Fatalf("%s: %d %s", what, r.Status, r.Raw)
			}
			return r
		}

		// Right after a create, its /workspace still being cloned.
		id := s.createSandbox(k, map[string]any{"timeout": 300000})["sandboxId"].(string)
		if p := must(act(id, "pause"), "pause right after create"); p.Body["sandbox"].(map[string]any)["sandboxStatus"] != "paused" {
			t.Fatalf("pause right after create: %s", p.Raw)
		}
		must(act(id, "resume"), "resume")
		if got := shIn(t, s, k, id, "git -C /workspace remote get-url origin"); !strings.Contains(got, "sandboxd.internal") {
			t.Fatalf("/workspace after a pause right after create is not a clone: %q", got)
		}
		fresh := s.createSandbox(k, map[string]any{"timeout": 300000})["sandboxId"].(string)
		kids := must(act(fresh, "fork"), "fork right after create").Body["sandboxes"].([]any)
		if len(kids) != 1 || kids[0].(map[string]any)["sandboxStatus"] != "running" {
			t.Fatalf("fork right after create: %v", kids)
		}
		shIn(t, s, k, fresh, "true")

		// A parent counting in memory runs on from where it was, and so
		// does its child.
		shIn(t, s, k, id, `(i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done) >/dev/null 2>&1 &
sleep 0.5`)
		count := func(id string) int {
			t.Helper()
			n, err := strconv.Atoi(strings.TrimSpace(shIn(t, s, k, id, "cat /tmp/count")))
			if err != nil {
				t.Fatalf("count in %s: %v", id, err)
			}
			return n
		}
		before := count(id)
		kids = must(act(id, "fork"), "fork").Body["sandboxes"].([]any)
		waitCountPast(t, count, id, before)
		waitCountPast(t, count, kids[0].(map[string]any)["sandboxId"].(string), before)

		// A paused parent is resumed, forked, and runs on.
		must(act(id, "pause"), "pause")
		kids = must(act(id, "fork"), "fork of a paused parent").Body["sandboxes"].([]any)
		waitCountPast(t, count, kids[0].(map[string]any)["sandboxId"].(string), before)
		waitCountPast(t, count, id, count(id))

		// A listening socket: Debian's 2022 runsc cannot save it.
		shIn(t, s, k, id, `perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(Listen => 1, LocalPort => 8080, ReuseAddr => 1) or die; sleep 600' >/dev/null 2>&1 &
sleep 0.5`)
		for _, what := range []string{"pause", "fork"} {
			r := act(id, what)
			if name != "debian" {
				must(r, what+" with a listening socket")
				if what == "pause" {
					must(act(id, "resume"), "resume")
				}
				continue
			}
			msg, _ := r.Body["error"].(string)
			if r.Status != 409 || !strings.Contains(msg, "0.0.0.0:8080 LISTEN") {
				t.Fatalf("%s with a listening socket on the 2022 runsc: %d %s", what, r.Status, r.Raw)
			}
			waitCountPast(t, count, id, count(id))
		}

	})
}

// TestSaveNetwork: a sandbox with a network keeps its address and
// default route across a pause and a fork on every runtime (gVisor's
// netstack takes them from the namespace it is restored in), and a fork's
// child has an address of its own.
func TestSaveNetwork(t *testing.T) {
	onEveryRuntime(t, func(t *testing.T, _ string, flags []string) {
		s := startServer(t, "", flags...)
		k := s.createKey(s.createAccount("netsaver", false).ID)
		act := func(id, what string) response {
			t.Helper()
			r := s.as(k, "POST", "/api/sandboxes/"+id+"/"+what, map[string]any{})
			if r.Status != 200 {
				t.Fatalf("%s with a network: %d %s", what, r.Status, r.Raw)
			}
			return r
		}
		netID := s.createSandbox(k, map[string]any{"timeout": 300000, "network": "egress"})["sandboxId"].(string)
		addr := func(id string) string {
			t.Helper()
			return strings.TrimSpace(shIn(t, s, k, id, `ip -4 -o addr show eth0 | awk '{print $4}'; ip -4 route show default | awk '{print $3}'`))
		}
		was := addr(netID)
		if len(strings.Fields(was)) != 2 {
			t.Fatalf("address and gateway of a sandbox with a network: %q", was)
		}
		act(netID, "pause")
		act(netID, "resume")
		if got := addr(netID); got != was {
			t.Fatalf("address and gateway after a pause: %q, were %q", got, was)
		}
		kid := act(netID, "fork").Body["sandboxes"].([]any)[0].(map[string]any)["sandboxId"].(string)
		if got := addr(netID); got != was {
			t.Fatalf("the parent's address and gateway after a fork: %q, were %q", got, was)
		}
		if got := addr(kid); len(strings.Fields(got)) != 2 || strings.Fields(got)[0] == strings.Fields(was)[0] {
			t.Fatalf("the child's address and gateway %q, the parent's %q: the child has its own", got, was)
		}
	})
}

// waitCountPast waits until the counter in sandbox id is past n: it runs
// on (the bound is generous: only a counter that stopped reaches it).
func waitCountPast(t *testing.T, count func(string) int, id string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for count(id) <= n {
		if time.Now().After(deadline) {
			t.Fatalf("the counter in %s did not go past %d", id, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
