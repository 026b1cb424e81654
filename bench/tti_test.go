package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestLatency(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	l := latency(ds, 125)
	if l.N != 125 || l.OK != 100 || l.SuccessRate != 0.8 || l.P50 != 50 || l.P95 != 95 || l.P99 != 99 || l.Min != 1 || l.Max != 100 {
		t.Fatalf("%+v", l)
	}
	if l := latency(nil, 3); l.OK != 0 || l.SuccessRate != 0 || l.P50 != 0 {
		t.Fatalf("no successes: %+v", l)
	}
}

func TestTTIChart(t *testing.T) {
	r := TTIReport{Command: []string{"echo", "<ok>"}, Results: []TTIResult{
		{Account: "fresh", Mode: "burst", Latency: Latency{N: 20, OK: 19, P50: 120, P95: 300, P99: 340}},
	}, Baseline: Latency{N: 10, OK: 10, P50: 180, P95: 200, P99: 210}}
	var b bytes.Buffer
	if err := TTIChart(&b, r); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	for _, want := range []string{"<svg", "echo &lt;ok&gt;", "fresh", "burst", "19/20 ok", "bare runsc run+exec", "500", "</svg>"} {
		if !strings.Contains(svg, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if n := strings.Count(svg, "<title>"); n != 6 {
		t.Errorf("%d bars, want 6", n)
	}
}
