package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// What an operator needs to see of a node: its sandboxes by state, the
// runs, what the lifecycle operations do and how long a create takes, and
// the node's disk and memory as admission sees them. Counters are kept as
// the operations end (opMetrics, one deferred line in each operation);
// everything else is read at each scrape, from the database (one grouped
// query each, over what is live) and from the node.

// Operations, as sandboxd_sandbox_operations_total names them.
const (
	opCreate = "create"
	opPause  = "pause"
	opFork   = "fork"
)

// recentRuns is the window of sandboxd_runs_finished_recently.
const recentRuns = time.Hour

// scrapeTimeout bounds the database reads of one scrape.
const scrapeTimeout = 5 * time.Second

// opMetrics counts the lifecycle operations of this node. A nil one counts
// nothing.
type opMetrics struct {
	ops         *prometheus.CounterVec
	createTime  prometheus.Histogram
	diskRefusal *prometheus.CounterVec
}

func newOpMetrics() *opMetrics {
	o := &opMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_sandbox_operations_total",
			Help: "Sandbox creates (the service's own included), pauses and forks on this node by outcome: ok, refused (quota, capacity or disk), rejected (invalid, or the sandbox's state) or failed.",
		}, []string{"op", "outcome"}),
		createTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandboxd_sandbox_create_seconds",
			Help:    "Time from a create's admission to the sandbox running, of the creates that succeeded.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}),
		diskRefusal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_disk_admission_refused_total",
			Help: "Requests this node's disk admission refused, by what needed the room: sandbox (a new sandbox's disk: create, fork, prewarm), pause or fork (the memory saved).",
		}, []string{"for"}),
	}
	// Every series from the start, at 0: a rate needs the zero before the
	// first event.
	for _, op := range []string{opCreate, opPause, opFork} {
		for _, outcome := range []string{"ok", "refused", "rejected", "failed"} {
			o.ops.WithLabelValues(op, outcome)
		}
	}
	for _, need := range []string{"sandbox", opPause, opFork} {
		o.diskRefusal.WithLabelValues(need)
	}
	return o
}

// observe counts operation op, begun at start, that ended with err.
func (o *opMetrics) observe(op string, start time.Time, err error) {
	if o == nil {
		return
	}
	outcome := outcomeOf(err)
	o.ops.WithLabelValues(op, outcome).Inc()
	if op == opCreate && outcome == "ok" {
		o.createTime.Observe(time.Since(start).Seconds())
	}
}

// diskRefused counts a disk admission for what that ended with err, if
// err is its refusal.
func (o *opMetrics) diskRefused(what string, err error) {
	if o != nil && errors.Is(err, errdefs.ErrQuota) {
		o.diskRefusal.WithLabelValues(what).Inc()
	}
}

func outcomeOf(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errdefs.ErrQuota):
		return "refused"
	case errors.Is(err, errdefs.ErrInvalid), errors.Is(err, errdefs.ErrNotRunning), errors.Is(err, errdefs.ErrNotFound),
		errors.Is(err, errdefs.ErrForbidden), errors.Is(err, errdefs.ErrTooLarge):
		return "rejected"
	}
	return "failed"
}

var (
	sandboxesDesc = prometheus.NewDesc("sandboxd_sandboxes",
		"Live sandboxes on this node by state (pending, running, pausing, paused, resuming, stopping) and runtime.", []string{"state", "runtime"}, nil)
	runsDesc = prometheus.NewDesc("sandboxd_runs",
		"Runs queued or executing, over every node (the database's count: every node of a cluster reports the same).", []string{"status"}, nil)
	recentRunsDesc = prometheus.NewDesc("sandboxd_runs_finished_recently",
		"Runs that finished in the last hour by status, over every node (the database's count).", []string{"status"}, nil)
	diskDesc = prometheus.NewDesc("sandboxd_node_disk_bytes",
		"This node's disk as its admission sees it: free (to unprivileged writers), reserved (kept for the service), promised (what the active and warm sandboxes may still write to their disks), saving (reserved by saves of memory under way). A create needs free - reserved - promised - saving >= the sandbox disk.", []string{"kind"}, nil)
	memoryDesc = prometheus.NewDesc("sandboxd_node_memory_bytes",
		"This node's memory: available (the host's MemAvailable) and promised (the memory limit of each live, unpaused or warm sandbox; absent without a limit).", []string{"kind"}, nil)
	capacityDesc = prometheus.NewDesc("sandboxd_node_capacity_sandboxes",
		"Sandboxes this node takes at once (--node-capacity); 0 unlimited.", nil, nil)
)

// sandboxStates are the states sandboxd_sandboxes reports, zero or not.
var sandboxStates = []string{string(store.SandboxPending), string(store.SandboxRunning), store.PausePausing, store.PausePaused, store.PauseResuming, string(store.SandboxStopping)}

// Metrics is a Prometheus collector of this node's sandboxes, runs,
// operations and admission (see the README's Metrics section).
func (m *Manager) Metrics() prometheus.Collector { return managerCollector{m} }

type managerCollector struct{ m *Manager }

func (c managerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sandboxesDesc, runsDesc, recentRunsDesc, diskDesc, memoryDesc, capacityDesc} {
		ch <- d
	}
	c.m.ops.ops.Describe(ch)
	c.m.ops.createTime.Describe(ch)
	c.m.ops.diskRefusal.Describe(ch)
}

func (c managerCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.ops.ops.Collect(ch)
	m.ops.createTime.Collect(ch)
	m.ops.diskRefusal.Collect(ch)
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	ch <- prometheus.MustNewConstMetric(capacityDesc, prometheus.GaugeValue, float64(m.cfg.Settings.NodeCapacity))
	if err := m.collectSandboxes(ctx, ch); err != nil {
		m.log.Warn("metrics: sandboxes", "err", err)
	}
	if err := m.collectRuns(ctx, ch); err != nil {
		m.log.Warn("metrics: runs", "err", err)
	}
	if err := m.collectDisk(ctx, ch); err != nil {
		m.log.Warn("metrics: disk", "err", err)
	}
}

// collectSandboxes reports the live sandboxes by state, and the memory
// they and the warm ones are promised.
func (m *Manager) collectSandboxes(ctx context.Context, ch chan<- prometheus.Metric) error {
	counts, err := m.st.CountLiveSandboxes(ctx, m.cfg.NodeID)
	if err != nil {
		return err
	}
	byState := map[[2]string]int64{}
	for _, s := range sandboxStates {
		byState[[2]string{s, m.rt.Name()}] = 0
	}
	var holdingMemory int64
	for _, c := range counts {
		state := string(c.Status)
		if c.Status == store.SandboxRunning && c.Pause != "" {
			state = c.Pause
		}
		byState[[2]string{state, c.Runtime}] += c.N
		if state != store.PausePaused {
			holdingMemory += c.N
		}
	}
	for k, n := range byState {
		ch <- prometheus.MustNewConstMetric(sandboxesDesc, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	if avail, err := memAvailable(); err == nil {
		ch <- prometheus.MustNewConstMetric(memoryDesc, prometheus.GaugeValue, float64(avail), "available")
	}
	if limit := m.cfg.Settings.Limits.MemoryBytes; limit > 0 {
		promised := (holdingMemory + int64(m.warmSandboxes())) * limit
		ch <- prometheus.MustNewConstMetric(memoryDesc, prometheus.GaugeValue, float64(promised), "promised")
	}
	return nil
}

// warmSandboxes are the sandboxes started ahead on this node.
func (m *Manager) warmSandboxes() int {
	warm := m.warmPooled()
	if pw, ok := m.rt.(runtime.Prewarmer); ok {
		warm += pw.PrewarmStats().Kept
	}
	return warm + m.templatePooled()
}

// collectRuns reports the runs queued or executing and those finished in
// the last recentRuns, by status.
func (m *Manager) collectRuns(ctx context.Context, ch chan<- prometheus.Metric) error {
	counts, err := m.st.CountRuns(ctx, m.now().Add(-recentRuns))
	if err != nil {
		return err
	}
	active := map[store.RunStatus]int64{store.RunQueued: 0, store.RunExecuting: 0}
	recent := map[store.RunStatus]int64{store.RunCompleted: 0, store.RunFailed: 0, store.RunCrashed: 0, store.RunCanceled: 0}
	for _, c := range counts {
		if _, ok := active[c.Status]; ok {
			active[c.Status] = c.N
		} else {
			recent[c.Status] = c.N
		}
	}
	for status, n := range active {
		ch <- prometheus.MustNewConstMetric(runsDesc, prometheus.GaugeValue, float64(n), string(status))
	}
	for status, n := range recent {
		ch <- prometheus.MustNewConstMetric(recentRunsDesc, prometheus.GaugeValue, float64(n), string(status))
	}
	return nil
}

// collectDisk reports the node's disk as admission balances it, read
// under the admission's lock as a create would read it.
func (m *Manager) collectDisk(ctx context.Context, ch chan<- prometheus.Metric) error {
	if m.cfg.DataDir == "" {
		return nil
	}
	m.diskMu.Lock()
	b, err := m.balance(ctx)
	m.diskMu.Unlock()
	if err != nil {
		return err
	}
	for kind, v := range map[string]int64{"free": b.free, "reserved": b.reserve, "promised": b.promised, "saving": b.saving} {
		ch <- prometheus.MustNewConstMetric(diskDesc, prometheus.GaugeValue, float64(v), kind)
	}
	return nil
}

// memAvailable is the host's MemAvailable, in bytes.
func memAvailable() (int64, error) {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		var kib int64
		if n, _ := fmt.Sscanf(sc.Text(), "MemAvailable: %d kB", &kib); n == 1 {
			return kib << 10, nil
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}
