package e2e

import (
	"bufio"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestOperatorView: what an operator of a running server sees. /metrics
// has the sandboxes by state, the runs, the creates, pauses and forks
// with their outcomes and the creates' latency, and the node's disk and
// memory; the log at debug shows that ordinary requests and River's
// periodic status lines are debug lines (so that at the default info
// level they are not there), and nothing above debug carries a stack.
func TestOperatorView(t *testing.T) {
	s := startServer(t, filepath.Join(t.TempDir(), "operator.db"), "--log-level", "debug")
	k := s.createKey(s.createAccount("operated", false).ID)
	runID := s.createSandbox(k, map[string]any{"command": "sh", "args": []string{"-c", "echo hi; exit 3"}})["runId"].(string)
	if r := s.waitRun(k, runID, 2*time.Minute); r.Status != "COMPLETED" {
		t.Fatalf("run %s: %+v", r.Status, r.Error)
	}
	id := s.createSandbox(k, map[string]any{"timeout": 120000})["sandboxId"].(string)
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/fork", map[string]any{"count": 1}); r.Status != 200 {
		t.Fatalf("fork: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/fork", map[string]any{"count": 1, "timeout": 999999999999}); r.Status != 400 {
		t.Fatalf("fork beyond the longest timeout: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "POST", "/api/sandboxes/"+id+"/pause", map[string]any{}); r.Status != 200 {
		t.Fatalf("pause: %d %s", r.Status, r.Raw)
	}
	if r := s.as(k, "GET", "/api/nothing-here", nil); r.Status != 404 {
		t.Fatalf("unknown route: %d", r.Status)
	}

	t.Run("metrics", func(t *testing.T) {
		m := scrape(t, s)
		for series, want := range map[string]float64{
			`sandboxd_sandbox_operations_total{op="create",outcome="ok"}`:     2,
			`sandboxd_sandbox_operations_total{op="fork",outcome="ok"}`:       1,
			`sandboxd_sandbox_operations_total{op="fork",outcome="rejected"}`: 1,
			`sandboxd_sandbox_operations_total{op="pause",outcome="ok"}`:      1,
			`sandboxd_sandbox_create_seconds_count`:                           2,
			`sandboxd_sandboxes{runtime="gvisor",state="paused"}`:             1,
			`sandboxd_sandboxes{runtime="gvisor",state="pending"}`:            0,
			`sandboxd_runs{status="QUEUED"}`:                                  0,
			`sandboxd_runs_finished_recently{status="COMPLETED"}`:             1,
			`sandboxd_disk_admission_refused_total{for="sandbox"}`:            0,
		} {
			if got, ok := m[series]; !ok || got != want {
				t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
			}
		}
		// The run's sandbox and the child run on; the parent is paused.
		if got := m[`sandboxd_sandboxes{runtime="gvisor",state="running"}`]; got < 1 {
			t.Errorf("running sandboxes: %v", got)
		}
		for _, series := range []string{`sandboxd_node_disk_bytes{kind="free"}`, `sandboxd_node_disk_bytes{kind="promised"}`, `sandboxd_node_memory_bytes{kind="available"}`} {
			if m[series] <= 0 {
				t.Errorf("%s = %v", series, m[series])
			}
		}
	})

	t.Run("log levels", func(t *testing.T) {
		// River reports its job counts every 5 s once they change: wait for
		// that line (it is the one that flooded the log at info).
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(s.logs.String(), "Producer job counts") {
			if time.Now().After(deadline) {
				t.Fatal("River reported no job counts")
			}
			time.Sleep(100 * time.Millisecond)
		}
		var requests int
		for _, l := range strings.Split(s.logs.String(), "\n") {
			debug := strings.Contains(l, "level=DEBUG")
			switch {
			case strings.Contains(l, `msg="http request"`):
				requests++
				if !debug && !strings.Contains(l, "status=5") && firstByte(t, l) <= time.Second {
					t.Errorf("a quick request's line above debug: %s", l)
				}
			case strings.Contains(l, "Producer job counts"), strings.Contains(l, "River client started"), strings.Contains(l, "rivermigrate"):
				if !debug {
					t.Errorf("River's status line above debug: %s", l)
				}
			}
			if !debug && (strings.Contains(l, "goroutine ") || strings.Contains(l, ".go:")) {
				t.Errorf("a stack above debug: %s", l)
			}
		}
		if requests == 0 {
			t.Fatal("no request lines at debug")
		}
	})
}

// firstByte is the first_byte of a request's log line.
func firstByte(t *testing.T, line string) time.Duration {
	t.Helper()
	_, v, ok := strings.Cut(line, " first_byte=")
	if !ok {
		t.Fatalf("no first_byte in %s", line)
	}
	v, _, _ = strings.Cut(v, " ")
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("first_byte in %s: %v", line, err)
	}
	return d
}

// scrape reads the server's /metrics into series (name and labels as
// written there) and values.
func scrape(t *testing.T, s *server) map[string]float64 {
	t.Helper()
	resp, err := http.Get(s.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}
