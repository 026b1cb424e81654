package bench

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/progress"
)

// synthetic is a Timing of n samples around median ms, spread like a
// latency: most near the median, a tail above it.
func synthetic(rng *rand.Rand, n int, median float64) Timing {
	var ds []time.Duration
	for range n {
		ds = append(ds, time.Duration(median*(0.8+0.4*rng.Float64()+rng.ExpFloat64()*0.1)*float64(time.Millisecond)))
	}
	return timing(ds)
}

func syntheticLatency(rng *rand.Rand, n int, median float64) Latency {
	t := synthetic(rng, n, median)
	return Latency{N: n, OK: n, Samples: t.Samples}
}

// svgText checks that path is well-formed XML with an <svg> root and
// returns its text, decoded.
func svgText(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	var text strings.Builder
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not valid XML: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
		case xml.CharData:
			text.Write(tok)
			text.WriteByte('\n')
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q, want svg", path, root)
	}
	return text.String()
}

// checkCharts writes charts into a fresh directory and checks that each
// named file was written, is an SVG, and names each of its cases.
func checkCharts(t *testing.T, charts []Chart, want map[string][]string) {
	t.Helper()
	dir := t.TempDir()
	paths, err := WriteCharts(filepath.Join(dir, "charts"), charts)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != len(want) {
		t.Errorf("wrote %v, want %d charts", paths, len(want))
	}
	for file, names := range want {
		text := svgText(t, filepath.Join(dir, "charts", file))
		for _, n := range names {
			if !strings.Contains(text, n) {
				t.Errorf("%s does not name %q:\n%s", file, n, text)
			}
		}
	}
}

func TestReportCharts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var r Report
	r.Platform = "systrap"
	r.CreateCold, r.CreateWarm = synthetic(rng, 20, 185), synthetic(rng, 20, 1.6)
	r.ExecTrue, r.ListDir, r.RunscExec = synthetic(rng, 199, 12.5), synthetic(rng, 199, 2), synthetic(rng, 20, 17.6)
	r.Baseline.RunscRun, r.Baseline.RunscDetachMs = synthetic(rng, 20, 101), synthetic(rng, 20, 89)
	r.Concurrent.N, r.Concurrent.Each = 10, synthetic(rng, 10, 800)
	r.Snapshot.ChangedMiB, r.Snapshot.QuiesceMs, r.Snapshot.SnapshotMs, r.Snapshot.ApplyMs, r.Snapshot.RestoreMs = 100, 544, 510, 161, 904
	checkCharts(t, r.Charts(), map[string][]string{
		"start.svg":      {"Create to running (systrap)", "create, cold (n=20, p50", "create, warm pool", "bare runsc run /bin/true", "bare runsc run --detach"},
		"exec.svg":       {"exec true, agent (n=199", "list /, agent", "bare runsc exec /bin/true"},
		"concurrent.svg": {"10 creates at once", "create, 10 at once"},
		"snapshot.svg":   {"Snapshot of 100 MiB changed", "quiesce", "snapshot", "unpack alone", "create from it", "904", "bare runsc run --detach"},
	})
}

func TestOtherReportsCharts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tti := TTIReport{Command: []string{"echo", "ok"}, Platform: "systrap",
		Baseline: syntheticLatency(rng, 10, 131), BaselineRun: syntheticLatency(rng, 10, 101)}
	for _, m := range []string{"sequential", "burst", "after-run"} {
		tti.Results = append(tti.Results, TTIResult{Account: "snapshot", Mode: m, Latency: syntheticLatency(rng, 10, 70), Create: syntheticLatency(rng, 10, 6)})
	}
	checkCharts(t, tti.Charts(), map[string][]string{
		"tti.svg":        {`Create to first "echo ok"`, "snapshot account, sequential", "snapshot account, after-run", "bare runsc run --detach + exec"},
		"tti-create.svg": {"snapshot account, burst", "bare runsc run --detach (n=10"},
	})

	pause := PauseReport{Platform: "systrap", TouchMiB: 256, ForkCount: 5,
		PauseIdle: synthetic(rng, 5, 119), ResumeIdle: synthetic(rng, 5, 138), ForkIdle: synthetic(rng, 2, 680),
		PauseTouched: synthetic(rng, 5, 395), ResumeTouched: synthetic(rng, 5, 364), ForkTouched: synthetic(rng, 2, 1563)}
	pause.Baseline.Checkpoint, pause.Baseline.Restore = synthetic(rng, 5, 28), synthetic(rng, 5, 104)
	checkCharts(t, pause.Charts(), map[string][]string{
		"pause.svg":  {"pause, idle", "pause, 256 MiB touched", "bare runsc checkpoint, idle"},
		"resume.svg": {"resume, idle", "bare runsc restore --detach, idle"},
		"fork.svg":   {"Fork of 5", "fork, 256 MiB touched (n=2"},
	})

	density := DensityReport{Started: 200, StartFirstTenth: synthetic(rng, 20, 430), StartLastTenth: synthetic(rng, 20, 743),
		Starts:          synthetic(rng, 200, 600).Samples,
		MemAvailDropMiB: 15.4, CgroupMiB: 15.2, PSSMiB: 11.3, RSSMiB: 52.9, DiskMiB: 4.4, PerGiB: 66.5,
		FitByMemory: 1430, FitByIdleCPU: 1350, FitByDisk: 16000}
	checkCharts(t, density.Charts(), map[string][]string{
		"density-starts.svg": {"first tenth", "last tenth"},
		"density-trend.svg":  {"n-th sandbox started", "ms"},
		"density-memory.svg": {"host MemAvailable drop", "15.4", "disk", "MiB"},
		"density-fit.svg":    {"66.5 per GiB", "fit by memory", "1430", "fit by free disk"},
	})

	wl := WorkloadReport{Platform: "systrap", Results: map[string]Timing{"git-status": synthetic(rng, 5, 307), "npm-ci": synthetic(rng, 5, 1414)}}
	checkCharts(t, wl.Charts(), map[string][]string{"workloads.svg": {"git-status", "npm-ci"}})

	vm := MicroVMReport{Accel: "tcg", ForkCount: 5, ColdBoot: synthetic(rng, 5, 961), TemplateRestore: synthetic(rng, 5, 234),
		ExecTrue: synthetic(rng, 50, 20), Pause: synthetic(rng, 5, 409), Resume: synthetic(rng, 5, 149), Fork: synthetic(rng, 2, 1150)}
	checkCharts(t, vm.Charts(), map[string][]string{
		"microvm-start.svg": {"cold boot", "restore from the template's memory"},
		"microvm-exec.svg":  {"exec true, agent"},
		"microvm-pause.svg": {"pause", "resume", "fork of 5"},
	})
}

// TestChartsSkipWhatWasNotMeasured: a report without samples (a phase that
// did not run) draws no distribution, and a chart of one sample still
// draws.
func TestChartsSkipWhatWasNotMeasured(t *testing.T) {
	dir := t.TempDir()
	paths, err := WriteCharts(dir, (PauseReport{}).Charts())
	if err != nil || len(paths) != 0 {
		t.Fatalf("wrote %v (%v) for an empty report", paths, err)
	}
	one := Chart{File: "one.svg", Title: "one", Series: []Series{{Name: "only", Samples: []float64{0}}}}
	checkCharts(t, []Chart{one}, map[string][]string{"one.svg": {"only (n=1, p50 0.00 ms)"}})
}

// TestPhases: a benchmark's phases are one task of its tracker, counted.
func TestPhases(t *testing.T) {
	var rec progress.Recorder
	ph := startPhases(&rec, "bench", 2)
	ph.next("cold")
	ph.next("warm")
	ph.done(nil)
	got := rec.Snapshot()
	want := []progress.State{{Step: "cold", Current: 0}, {Step: "warm", Current: 1}}
	if len(got) != 1 || got[0].Title != "bench" || got[0].Total != 2 || !slices.Equal(got[0].States, want) || !got[0].Ended {
		t.Fatalf("%+v", got)
	}
}

// TestClusterCharts: a cluster run's charts, from the report of the
// 10-node run kept in this directory.
func TestClusterCharts(t *testing.T) {
	b, err := os.ReadFile("cluster-n10.json")
	if err != nil {
		t.Fatal(err)
	}
	var r ClusterReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	checkCharts(t, r.Charts(), map[string][]string{
		"cluster-latency.svg":    {"Requests on 10 nodes", "in flight", "exec"},
		"cluster-statements.svg": {"statements per request"},
		"cluster-idle.svg":       {"River's job fetching, per node"},
		"cluster-cpu.svg":        {"idle: PostgreSQL"},
	})
}
