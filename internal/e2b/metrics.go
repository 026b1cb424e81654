package e2b

import (
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
)

// metric is E2B's SandboxMetric.
type metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// cpuSamples remembers each sandbox's last CPU reading, so that a
// metric's CPU use is over the time since the previous one (since the
// sandbox started, the first time).
type cpuSamples struct {
	mu   sync.Mutex
	last map[string]cpuSample
}

type cpuSample struct {
	at  time.Time
	cpu time.Duration
}

// usedPct is the share of cpus that cpu (total so far, read at now) used
// since the last reading of id, or since started.
func (c *cpuSamples) usedPct(id string, started, now time.Time, cpu time.Duration, cpus int) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]cpuSample{}
	}
	prev, ok := c.last[id]
	if !ok {
		prev = cpuSample{at: started}
	}
	c.last[id] = cpuSample{at: now, cpu: cpu}
	// Readings of ended sandboxes would pile up: the map is small, so
	// sweep it whenever it grows large.
	if len(c.last) > 4096 {
		for k, s := range c.last {
			if now.Sub(s.at) > time.Hour {
				delete(c.last, k)
			}
		}
	}
	wall := now.Sub(prev.at)
	if wall <= 0 || cpus <= 0 {
		return 0
	}
	return min(100, 100*float64(cpu-prev.cpu)/float64(wall)/float64(cpus))
}

// metrics answers the sandbox's resource use, measured from its cgroup on
// the host: its history (kept every 5 s for its last hour on the node that
// hosts it: sandbox.Manager.UsageHistory) within start and end (Unix
// seconds; both optional), and a measure taken now when the range reaches
// now. A paused sandbox uses nothing and is not measured.
func (a *API) metrics(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	sb, _, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	from, to, err := metricsRange(r.URL.Query())
	if err != nil {
		return err
	}
	now := a.opts.Now()
	// The samples before from too, for the first one's CPU share.
	history, err := a.opts.Sandboxes.UsageHistory(r.Context(), c.Principal, sb.ID, time.Time{}, to)
	if err != nil {
		return err
	}
	out := []metric{}
	prev := sandbox.UsageSample{At: sb.CreatedAt}
	for _, s := range history {
		if from.IsZero() || !s.At.Before(from) {
			out = append(out, a.metricOfSample(s, prev))
		}
		prev = s
	}
	if sb.Pause == "" && (to.IsZero() || !to.Before(now.Truncate(time.Second))) {
		st, err := a.opts.Sandboxes.Stats(r.Context(), c.Principal, sb.ID)
		if err != nil {
			return err
		}
		out = append(out, a.metricOf(sb.ID, sb.CreatedAt, now, st))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// metricsRange reads start and end (Unix seconds; zero: open).
func metricsRange(q url.Values) (from, to time.Time, err error) {
	read := func(name string) (time.Time, error) {
		s := q.Get(name)
		if s == "" {
			return time.Time{}, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return time.Time{}, edge.Errorf(http.StatusBadRequest, "%s must be a Unix time in seconds", name)
		}
		return time.Unix(n, 0), nil
	}
	if from, err = read("start"); err != nil {
		return
	}
	if to, err = read("end"); err != nil {
		return
	}
	if !from.IsZero() && !to.IsZero() && to.Before(from) {
		err = edge.Errorf(http.StatusBadRequest, "end is before start")
		return
	}
	if !to.IsZero() {
		to = to.Add(time.Second - time.Nanosecond) // the whole second end names
	}
	return from, to, nil
}

// metricOfSample is sample s as E2B's metric, its CPU share over the
// span since prev.
func (a *API) metricOfSample(s, prev sandbox.UsageSample) metric {
	pct := 0.0
	if wall := s.At.Sub(prev.At); wall > 0 && a.opts.CPUs > 0 {
		pct = min(100, max(0, 100*float64(s.CPU-prev.CPU)/float64(wall)/float64(a.opts.CPUs)))
	}
	return metric{Timestamp: s.At.UTC(), TimestampUnix: s.At.Unix(), CPUCount: a.opts.CPUs, CPUUsedPct: pct,
		MemUsed: s.MemoryBytes, MemTotal: int64(a.opts.MemoryMB) << 20, DiskUsed: s.DiskBytes, DiskTotal: int64(a.opts.DiskMB) << 20}
}

func (a *API) metricOf(id string, started, now time.Time, st runtime.Stats) metric {
	return metric{
		Timestamp: now.UTC(), TimestampUnix: now.Unix(), CPUCount: a.opts.CPUs,
		CPUUsedPct: a.cpu.usedPct(id, started, now, st.CPU, a.opts.CPUs),
		MemUsed:    st.MemoryBytes, MemTotal: int64(a.opts.MemoryMB) << 20,
		DiskUsed: st.DiskBytes, DiskTotal: int64(a.opts.DiskMB) << 20,
	}
}
