package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestMetrics: /metrics reports the node's sandboxes by state, the runs,
// each create, pause and fork with its outcome, the creates' latency, and
// the disk and memory admission sees, with the disk's refusals.
func TestMetrics(t *testing.T) {
	const gib = int64(1) << 30
	p := newPlane(t, Settings{MaxTimeout: time.Hour, NodeCapacity: 10, DiskReserveBytes: gib,
		Limits: runtime.Limits{DiskBytes: 2 * gib, MemoryBytes: 256 << 20}})
	free := 10 * gib // room for 4 sandboxes of 2 GiB and a fork's save, beside the reserve
	p.m.diskFreeFn = func(string) (int64, error) { return free, nil }
	ctx := context.Background()
	var made []store.Sandbox
	for range 3 {
		sb, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Lifetime: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, sb)
	}
	if _, err := p.m.pause(ctx, made[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.fork(ctx, made[1], 1, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.m.fork(ctx, made[1], 0, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatal(err)
	}
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{}); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a fifth sandbox: %v", err)
	}
	if _, _, err := p.m.Create(ctx, p.account.ID, CreateRequest{Command: "true"}); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a sixth: %v", err)
	}
	if _, err := p.m.stopByRequest(ctx, made[2]); err != nil {
		t.Fatal(err)
	}

	got := gather(t, p.m.Metrics())
	for series, want := range map[string]float64{
		`sandboxd_sandbox_operations_total{op="create",outcome="ok"}`:      3,
		`sandboxd_sandbox_operations_total{op="create",outcome="refused"}`: 2,
		`sandboxd_sandbox_operations_total{op="pause",outcome="ok"}`:       1,
		`sandboxd_sandbox_operations_total{op="fork",outcome="ok"}`:        1,
		`sandboxd_sandbox_operations_total{op="fork",outcome="rejected"}`:  1,
		`sandboxd_sandbox_create_seconds_count`:                            3,
		`sandboxd_disk_admission_refused_total{for="sandbox"}`:             2,
		`sandboxd_sandboxes{runtime="fake",state="running"}`:               2, // made[1] and its child
		`sandboxd_sandboxes{runtime="fake",state="paused"}`:                1,
		`sandboxd_sandboxes{runtime="fake",state="pending"}`:               0,
		`sandboxd_node_capacity_sandboxes`:                                 10,
		`sandboxd_node_disk_bytes{kind="free"}`:                            float64(free),
		`sandboxd_node_disk_bytes{kind="reserved"}`:                        float64(gib),
		`sandboxd_node_disk_bytes{kind="promised"}`:                        float64(6 * gib), // the paused one keeps its disk
		`sandboxd_node_disk_bytes{kind="saving"}`:                          0,
		`sandboxd_node_memory_bytes{kind="promised"}`:                      2 * 256 << 20, // not the paused one
		`sandboxd_runs{status="QUEUED"}`:                                   0,
		`sandboxd_runs_finished_recently{status="COMPLETED"}`:              0,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (reported %v), want %v", series, v, ok, want)
		}
	}
	if got[`sandboxd_node_memory_bytes{kind="available"}`] <= 0 {
		t.Errorf("no available memory: %v", got)
	}
	if t.Failed() {
		t.Logf("reported: %v", got)
	}
}

// gather collects c and maps each series, written as in the exposition
// format (labels sorted), to its value; a histogram gives its _count.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			name, value := f.GetName(), 0.0
			switch {
			case m.Counter != nil:
				value = m.Counter.GetValue()
			case m.Gauge != nil:
				value = m.Gauge.GetValue()
			case m.Histogram != nil:
				name, value = name+"_count", float64(m.Histogram.GetSampleCount())
			}
			out[name+labels(m.GetLabel())] = value
		}
	}
	return out
}

func labels(pairs []*dto.LabelPair) string {
	if len(pairs) == 0 {
		return ""
	}
	var parts []string
	for _, l := range pairs {
		parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
	}
	return "{" + strings.Join(parts, ",") + "}"
}
