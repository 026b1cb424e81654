package e2b

import (
	"net/http"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/runtime"
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

// metrics answers the sandbox's resource use now, measured from its
// cgroup on the host: one entry (sandboxd keeps no history), none for a
// paused sandbox, which uses nothing.
func (a *API) metrics(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	sb, _, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	out := []metric{}
	if sb.Pause == "" {
		st, err := a.opts.Sandboxes.Stats(r.Context(), c.Principal, sb.ID)
		if err != nil {
			return err
		}
		now := a.opts.Now()
		out = append(out, a.metricOf(sb.ID, sb.CreatedAt, now, st))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) metricOf(id string, started, now time.Time, st runtime.Stats) metric {
	return metric{
		Timestamp: now.UTC(), TimestampUnix: now.Unix(), CPUCount: a.opts.CPUs,
		CPUUsedPct: a.cpu.usedPct(id, started, now, st.CPU, a.opts.CPUs),
		MemUsed:    st.MemoryBytes, MemTotal: int64(a.opts.MemoryMB) << 20,
		DiskUsed: st.DiskBytes, DiskTotal: int64(a.opts.DiskMB) << 20,
	}
}
