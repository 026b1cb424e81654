package e2e

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/securitytest"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestQuotaRace fires more simultaneous creates than the
// account's quota at a real server: the count and the insert are one
// locked transaction, so exactly the quota gets a sandbox.
func TestQuotaRace(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, dsn string) {
		securitytest.Attack(t, "quotas", "16 simultaneous POST /api/sandboxes of one account against a quota of 5",
			"exactly 5 answer 200 and 11 answer 429 on SQLite and PostgreSQL; the account has 5 active sandboxes")
		const quota, calls = 5, 16
		s := startServer(t, dsn, "--max-sandboxes-per-account", "5", "--warm-pool", "0")
		alice := s.createAccount("Alice", false)
		k := s.createKey(alice.ID)

		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			codes  = map[int]int{}
			start  = make(chan struct{})
			client = &http.Client{Timeout: 2 * time.Minute}
		)
		for range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", s.base+"/api/sandboxes", bytes.NewReader([]byte(`{}`)))
				req.Header.Set("x-api-key", k.Key)
				req.Header.Set("Content-Type", "application/json")
				<-start
				code := -1
				if resp, err := client.Do(req); err == nil {
					code = resp.StatusCode
					resp.Body.Close()
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}()
		}
		close(start)
		wg.Wait()
		if codes[200] != quota || codes[429] != calls-quota {
			t.Fatalf("answers %v, want %d × 200 and %d × 429", codes, quota, calls-quota)
		}
		r := s.as(k, "GET", "/api/sandboxes", nil)
		active := 0
		for _, sb := range r.Body["sandboxes"].([]any) {
			switch sb.(map[string]any)["sandboxStatus"] {
			case "pending", "running", "stopping":
				active++
			}
		}
		if active != quota {
			t.Fatalf("%d active sandboxes, want %d: %s", active, quota, r.Raw)
		}
	})
}

// TestAgentQuota queues more coding-agent runs than
// allowed while the account is at its sandbox quota: the runs beyond the
// cap are refused, and those accepted wait instead of starting a sandbox.
func TestAgentQuota(t *testing.T) {
	securitytest.Attack(t, "quotas", "an account at its sandbox quota posts 6 coding-agent runs in a row",
		"only --max-agent-runs-per-account (2) are accepted, the rest 429; the accepted ones stay queued and start no sandbox beyond the quota")
	// The agents' test image: coding-agent runs need a claude on PATH.
	s := startServer(t, storetest.SQLiteDSN(t), "--rootfs", agentRootfs(t), "--max-sandboxes-per-account", "2", "--max-agent-runs-per-account", "2", "--warm-pool", "0")
	bob := s.createAccount("Bob", false)
	k := s.createKey(bob.ID)
	for i := range 2 {
		if r := s.as(k, "POST", "/api/sandboxes", map[string]any{}); r.Status != 200 {
			t.Fatalf("create %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if r := s.as(k, "POST", "/api/sandboxes", map[string]any{}); r.Status != 429 {
		t.Fatalf("create over the quota: %d %s", r.Status, r.Raw)
	}
	var accepted []string
	for i := range 6 {
		r := s.as(k, "POST", "/api/tasks/coding-agent", map[string]any{"repo_url": s.base + "/git/" + bob.ID + ".git", "prompt": "fix it"})
		switch {
		case i < 2 && r.Status == 200:
			accepted = append(accepted, r.Body["runId"].(string))
		case i >= 2 && r.Status == 429:
		default:
			t.Fatalf("coding-agent run %d: %d %s", i, r.Status, r.Raw)
		}
	}
	// Give the workers time to pick the runs up: they must wait.
	time.Sleep(3 * time.Second)
	for _, id := range accepted {
		r := s.as(k, "GET", "/api/tasks/runs?runId="+id, nil)
		if r.Status != 200 {
			t.Fatalf("get run %s: %d %s", id, r.Status, r.Raw)
		}
		if st := r.Body["runs"].([]any)[0].(map[string]any)["status"]; st != "QUEUED" {
			t.Fatalf("run %s is %q while the account is at its quota, want QUEUED: %s", id, st, r.Raw)
		}
	}
	r := s.as(k, "GET", "/api/sandboxes", nil)
	if n := len(r.Body["sandboxes"].([]any)); n != 2 {
		t.Fatalf("%d sandboxes, want the 2 of the quota: %s", n, r.Raw)
	}
}

// TestSetupQuota: an account whose first sandbox fills its quota still gets
// set up (setup's sandbox counts, with one place beyond the quota), and
// its next sandbox is refused while the first runs.
func TestSetupQuota(t *testing.T) {
	securitytest.Attack(t, "quotas", "an account at its quota of 1 triggers its setup-sandbox task, whose sandbox the quota did not count before",
		"setup's sandbox is counted, with exactly one place of headroom: setup completes, and a second user sandbox is still refused with 429")
	s := startServer(t, storetest.SQLiteDSN(t), "--rootfs", agentRootfs(t), "--setup-on-first-use=true", "--max-sandboxes-per-account", "1")
	a := s.createAccount("carol", false)
	k := s.createKey(a.ID)
	s.createSandbox(k, map[string]any{})
	var setupID string
	deadline := time.Now().Add(time.Minute)
	for setupID == "" && time.Now().Before(deadline) {
		for _, v := range s.as(k, "GET", "/api/tasks/runs", nil).Body["runs"].([]any) {
			if r := v.(map[string]any); r["taskIdentifier"] == "setup-sandbox" {
				setupID = r["id"].(string)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if setupID == "" {
		t.Fatal("no setup-sandbox run")
	}
	if r := s.waitRun(k, setupID, 3*time.Minute); r.Status != "COMPLETED" {
		t.Fatalf("setup at the quota: %+v", r)
	}
	if r := s.as(k, "POST", "/api/sandboxes", map[string]any{}); r.Status != 429 {
		t.Fatalf("second sandbox over a quota of 1: %d %s", r.Status, r.Raw)
	}
}

// TestDiskOvercommit asks a real server for more sparse sandbox disks than
// its data directory's filesystem could hold if they were filled: the
// create beyond what the node can honour is refused with 429 and the
// figures, and a place freed by a stop is given out again.
func TestDiskOvercommit(t *testing.T) {
	securitytest.Attack(t, "disk",
		"an account creates sandboxes whose sparse disks, once filled, would need more space than the host's disk has",
		"the create the node could not honour is refused with 429 naming the free, promised and reserved space; after a stop the place is given out again")
	dataDir := t.TempDir()
	var st unix.Statfs_t
	if err := unix.Statfs(dataDir, &st); err != nil {
		t.Fatal(err)
	}
	const diskMiB = 4096
	freeMiB := int64(st.Bavail) * st.Bsize >> 20
	if freeMiB < 2*diskMiB {
		t.Skipf("%d MiB free under %s: too little to leave room for exactly one %d MiB sandbox", freeMiB, dataDir, diskMiB)
	}
	// Room for one sandbox and half of another: 2 GiB of slack either way
	// absorbs what other processes write meanwhile.
	reserve := freeMiB - diskMiB*3/2
	s := startServerIn(t, dataDir, storetest.SQLiteDSN(t), "--warm-pool", "0",
		"--sandbox-disk-mib", strconv.Itoa(diskMiB), "--disk-reserve-mib", strconv.FormatInt(reserve, 10))
	a := s.createAccount("alice", false)
	k := s.createKey(a.ID)
	first := s.as(k, "POST", "/api/sandboxes", map[string]any{})
	if first.Status != 200 {
		t.Fatalf("first create: %d %s", first.Status, first.Raw)
	}
	second := s.as(k, "POST", "/api/sandboxes", map[string]any{})
	if second.Status != 429 || !strings.Contains(string(second.Raw), "cannot hold another sandbox of 4096 MiB") {
		t.Fatalf("second create: %d %s, want 429 naming the disk", second.Status, second.Raw)
	}
	id := first.Body["sandboxes"].([]any)[0].(map[string]any)["sandboxId"].(string)
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/stop", nil); r.Status != 200 {
		t.Fatalf("stop: %d %s", r.Status, r.Raw)
	}
	if third := s.as(k, "POST", "/api/sandboxes", map[string]any{}); third.Status != 200 {
		t.Fatalf("create after the stop: %d %s", third.Status, third.Raw)
	}
	s.stopAll(k)
}
