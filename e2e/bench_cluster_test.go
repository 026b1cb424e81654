package e2e

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob/blobtest"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// TestBenchCluster: `sandboxd bench cluster` on two fake-runtime nodes
// runs every phase to the end and reports them: every create, exec and
// stop succeeded, creates were placed, execs went through the other node,
// the killed node was declared down. No timing is checked.
func TestBenchCluster(t *testing.T) {
	dsn := storetest.PostgresDSN(t)
	s3 := blobtest.StartS3(t)
	cmd := exec.Command(binary, "bench", "cluster", "--nodes", "2", "--creates", "4", "--concurrency", "2",
		"--idle", "1s", "--node-down-after", "2s", "--database", dsn, "--blob-store", s3, "--json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bench cluster: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Nodes   int    `json:"nodes"`
		Runtime string `json:"runtime"`
		PGStats string `json:"pg_stats"`
		Creates []struct {
			Latency struct{ N, OK int } `json:"latency"`
			PG      struct {
				Transactions int64 `json:"transactions"`
				MaxConns     int   `json:"max_connections"`
			} `json:"pg"`
		} `json:"creates"`
		Placement struct{ Sandboxes int } `json:"placement"`
		Routed    struct {
			Latency struct{ N, OK int } `json:"latency"`
		} `json:"exec_routed"`
		Stops struct {
			Latency struct{ N, OK int } `json:"latency"`
		} `json:"stops"`
		Failure *struct {
			DownSeconds   float64 `json:"down_seconds"`
			FailedSeconds float64 `json:"failed_seconds"`
		} `json:"failure"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("report %s: %v", out, err)
	}
	t.Logf("PostgreSQL statistics from %s", rep.PGStats)
	if rep.Nodes != 2 || rep.Runtime != "fake" || len(rep.Creates) != 1 {
		t.Fatalf("report: %s", out)
	}
	c := rep.Creates[0]
	if c.Latency.N != 4 || c.Latency.OK != 4 || c.PG.Transactions <= 0 || c.PG.MaxConns <= 0 || rep.Placement.Sandboxes != 4 {
		t.Fatalf("creates: %s", out)
	}
	if rep.Routed.Latency.OK != 4 || rep.Stops.Latency.OK != 4 {
		t.Fatalf("execs or stops failed: %s", out)
	}
	if rep.Failure == nil || rep.Failure.DownSeconds <= 0 || rep.Failure.FailedSeconds <= 0 {
		t.Fatalf("failure: %s", out)
	}
}
