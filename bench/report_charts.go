package bench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The charts of each benchmark's report, which `sandboxd bench ... --charts
// DIR` writes: the latency distributions of its cases, the bare runtime's
// baseline beside sandboxd's where the benchmark measures both, and bars
// for what is measured once.

// series is t as a chart's case.
func (t Timing) series(name string) Series { return Series{Name: name, Samples: t.Samples} }

// baseline is t as a chart's baseline case.
func (t Timing) baseline(name string) Series {
	return Series{Name: name, Samples: t.Samples, Baseline: true}
}

// Charts of Run's report: starts, exec round trips, the concurrent starts,
// and snapshot and restore.
func (r Report) Charts() []Chart {
	return []Chart{
		{File: "start.svg", Title: "Create to running (" + r.Platform + ")", Series: []Series{
			r.CreateCold.series("create, cold"),
			r.CreateWarm.series("create, warm pool"),
			r.Baseline.RunscRun.baseline("bare runsc run /bin/true"),
			r.Baseline.RunscDetachMs.baseline("bare runsc run --detach"),
		}},
		{File: "exec.svg", Title: "Exec round trip (" + r.Platform + ")", Series: []Series{
			r.ExecTrue.series("exec true, agent"),
			r.ListDir.series("list /, agent"),
			r.RunscExec.baseline("bare runsc exec /bin/true"),
		}},
		{File: "concurrent.svg", Title: fmt.Sprintf("%d creates at once: each one's create to running", r.Concurrent.N), Series: []Series{
			r.Concurrent.Each.series(fmt.Sprintf("create, %d at once", r.Concurrent.N)),
			r.Baseline.RunscDetachMs.baseline("bare runsc run --detach, alone"),
		}},
		{File: "snapshot.svg", Title: fmt.Sprintf("Snapshot of %d MiB changed, and restore", r.Snapshot.ChangedMiB), Bars: []Bar{
			{Name: "quiesce", Value: r.Snapshot.QuiesceMs},
			{Name: "snapshot", Value: r.Snapshot.SnapshotMs},
			{Name: "unpack alone", Value: r.Snapshot.ApplyMs},
			{Name: "create from it", Value: r.Snapshot.RestoreMs},
			{Name: "bare runsc run --detach", Value: r.Baseline.RunscDetachMs.P50, Baseline: true},
		}},
	}
}

// Charts of RunTTI's report: create to the first command, and create to
// running, per account and mode, with the bare runtime.
func (r TTIReport) Charts() []Chart {
	first := Chart{File: "tti.svg", Title: fmt.Sprintf("Create to first %q through the API (%s)", strings.Join(r.Command, " "), r.Platform)}
	running := Chart{File: "tti-create.svg", Title: "Create to running: the create's answer (" + r.Platform + ")"}
	for _, res := range r.Results {
		name := res.Account + " account, " + res.Mode
		first.Series = append(first.Series, Series{Name: name, Samples: res.Latency.Samples})
		running.Series = append(running.Series, Series{Name: name, Samples: res.Create.Samples})
	}
	first.Series = append(first.Series, Series{Name: "bare runsc run --detach + exec", Samples: r.Baseline.Samples, Baseline: true},
		Series{Name: fmt.Sprintf("bare runsc run --detach + exec, %d at once", r.BaselineBurst.N), Samples: r.BaselineBurst.Samples, Baseline: true})
	running.Series = append(running.Series, Series{Name: "bare runsc run --detach", Samples: r.BaselineRun.Samples, Baseline: true})
	return []Chart{first, running}
}

// Charts of RunPause's report: pause, resume and fork, idle and with
// memory touched, beside the bare checkpoint and restore.
func (r PauseReport) Charts() []Chart {
	touched := fmt.Sprintf("%d MiB touched", r.TouchMiB)
	return []Chart{
		{File: "pause.svg", Title: "Pause: memory and processes saved (" + r.Platform + ")", Series: []Series{
			r.PauseIdle.series("pause, idle"),
			r.PauseTouched.series("pause, " + touched),
			r.Baseline.Checkpoint.baseline("bare runsc checkpoint, idle"),
		}},
		{File: "resume.svg", Title: "Resume to the agent answering (" + r.Platform + ")", Series: []Series{
			r.ResumeIdle.series("resume, idle"),
			r.ResumeTouched.series("resume, " + touched),
			r.Baseline.Restore.baseline("bare runsc restore --detach, idle"),
		}},
		{File: "fork.svg", Title: fmt.Sprintf("Fork of %d to every child answering (%s)", r.ForkCount, r.Platform), Series: []Series{
			r.ForkIdle.series("fork, idle"),
			r.ForkTouched.series("fork, " + touched),
		}},
	}
}

// Charts of RunDensity's report: each start by how many were running, and
// what one idle sandbox costs and how many fit.
func (r DensityReport) Charts() []Chart {
	return []Chart{
		{File: "density-starts.svg", Title: fmt.Sprintf("Starts of %d idle sandboxes: first and last tenth", r.Started), Series: []Series{
			r.StartFirstTenth.series("first tenth"),
			r.StartLastTenth.series("last tenth"),
		}},
		{File: "density-trend.svg", Title: "Each start of an idle sandbox, by how many were started", Trend: r.Starts,
			XLabel: "n-th sandbox started (n-1 running)"},
		{File: "density-memory.svg", Title: "Per idle sandbox", Unit: "MiB", Bars: []Bar{
			{Name: "host MemAvailable drop", Value: r.MemAvailDropMiB},
			{Name: "memory cgroup", Value: r.CgroupMiB},
			{Name: "PSS (sentry + gofer)", Value: r.PSSMiB},
			{Name: "RSS (sentry + gofer)", Value: r.RSSMiB},
			{Name: "disk", Value: r.DiskMiB},
		}},
		{File: "density-fit.svg", Title: fmt.Sprintf("Idle sandboxes on this host (%.1f per GiB)", r.PerGiB), Unit: "sandboxes", Bars: []Bar{
			{Name: "started", Value: float64(r.Started)},
			{Name: "fit by memory", Value: float64(r.FitByMemory)},
			{Name: "fit by idle CPU", Value: float64(r.FitByIdleCPU)},
			{Name: "fit by free disk", Value: float64(r.FitByDisk)},
		}},
	}
}

// Charts of RunWorkloads's report: each workload's runs.
func (r WorkloadReport) Charts() []Chart {
	c := Chart{File: "workloads.svg", Title: "Work inside one sandbox (" + r.Platform + ")"}
	for _, name := range slices.Sorted(maps.Keys(r.Results)) {
		c.Series = append(c.Series, r.Results[name].series(name))
	}
	return []Chart{c}
}

// Charts of RunMicroVM's report: boot and restore, exec, pause, resume and
// fork.
func (r MicroVMReport) Charts() []Chart {
	return []Chart{
		{File: "microvm-start.svg", Title: "microVM to agent-ready (" + r.Accel + ")", Series: []Series{
			r.ColdBoot.series("cold boot"),
			r.TemplateRestore.series("restore from the template's memory"),
		}},
		{File: "microvm-exec.svg", Title: "microVM exec round trip (" + r.Accel + ")", Series: []Series{
			r.ExecTrue.series("exec true, agent"),
		}},
		{File: "microvm-pause.svg", Title: fmt.Sprintf("microVM pause, resume and fork of %d (%s)", r.ForkCount, r.Accel), Series: []Series{
			r.Pause.series("pause"),
			r.Resume.series("resume"),
			r.Fork.series(fmt.Sprintf("fork of %d", r.ForkCount)),
		}},
	}
}

// Charts of RunCluster's report: the requests' latencies by phase, what
// PostgreSQL runs per request and per idle node, and the cores the nodes
// and PostgreSQL used in each phase.
func (r ClusterReport) Charts() []Chart {
	// The report keeps each phase's percentiles, not its samples.
	lat := Chart{File: "cluster-latency.svg", Title: fmt.Sprintf("Requests on %d nodes (simulated sandboxes): p50 and p99", r.Nodes)}
	statements := Chart{File: "cluster-statements.svg", Title: "PostgreSQL statements per request, less the idle load's", Unit: "statements"}
	cores := Chart{File: "cluster-cpu.svg", Title: "Cores used, by phase: the nodes, then PostgreSQL", Unit: "cores"}
	phases := append(append([]ClusterPhase{}, r.Creates...), r.Direct, r.Routed, r.Stops)
	for _, ph := range phases {
		name := ph.Name
		if ph.Concurrency > 0 {
			name = fmt.Sprintf("%s, %d in flight", ph.Name, ph.Concurrency)
		}
		lat.Bars = append(lat.Bars, Bar{Name: name + ", p50", Value: ph.Latency.P50}, Bar{Name: name + ", p99", Value: ph.Latency.P99})
		statements.Bars = append(statements.Bars, Bar{Name: name, Value: ph.PG.NetPerOp})
		cores.Bars = append(cores.Bars, Bar{Name: name + ": nodes", Value: ph.NodesCPU}, Bar{Name: name + ": PostgreSQL", Value: ph.PGCPU})
	}
	idle := Chart{File: "cluster-idle.svg", Title: "An idle node's cost to PostgreSQL", Unit: "statements per second", Bars: []Bar{
		{Name: "all, per node", Value: r.Heartbeat.StatementsPerNodeSec},
		{Name: "River's job fetching, per node", Value: r.Heartbeat.RiverPerNodeSec},
	}}
	cores.Bars = append(cores.Bars, Bar{Name: "idle: nodes", Value: r.Idle.NodesCPU}, Bar{Name: "idle: PostgreSQL", Value: r.Idle.PGCPU})
	return []Chart{lat, statements, idle, cores}
}

// Charts of RunExec's report: each command's latency beside the bare
// runtime's, and the output streamed.
func (r ExecReport) Charts() []Chart {
	lat := Chart{File: "exec.svg", Title: "Commands in a running sandbox, one after another (" + r.Platform + ")"}
	for _, c := range r.Cases {
		lat.Series = append(lat.Series, Series{Name: c.Name, Samples: c.Latency.Samples, Baseline: c.Baseline})
	}
	stream := Chart{File: "exec-stream.svg", Title: "A command's output streamed (" + r.Platform + ")", Unit: "MB/s"}
	for _, s := range r.Streams {
		stream.Bars = append(stream.Bars, Bar{Name: s.Name, Value: s.MBPerSec, Baseline: s.Baseline})
	}
	return []Chart{lat, stream}
}
