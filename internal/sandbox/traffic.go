package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// trafficMeter keeps, per account, what the networks of this node's ended
// sandboxes carried, so that the per-account counters of /metrics only go
// up while sandboxes come and go (a restart of sandboxd resets them, which
// Prometheus counters allow).
type trafficMeter struct {
	mu    sync.Mutex
	ended map[string]netpol.Traffic // account id -> sum
}

// endTraffic adds what sandbox id's network carried to its account's sum;
// called before the network hook tears the network (and its counters) down.
func (m *Manager) endTraffic(ctx context.Context, id string) {
	if m.network == nil {
		return
	}
	tr, err := m.network.Traffic(id)
	if err != nil || tr == nil {
		return
	}
	sb, err := m.st.GetSandbox(ctx, id)
	if err != nil {
		return
	}
	m.traffic.mu.Lock()
	defer m.traffic.mu.Unlock()
	if m.traffic.ended == nil {
		m.traffic.ended = map[string]netpol.Traffic{}
	}
	sum := m.traffic.ended[sb.AccountID]
	sum.Add(*tr)
	m.traffic.ended[sb.AccountID] = sum
}

var (
	sentDesc = prometheus.NewDesc("sandboxd_network_sent_bytes_total",
		"IP bytes the account's sandboxes on this node sent on their networks (drops of their policy included).", []string{"account_id"}, nil)
	receivedDesc = prometheus.NewDesc("sandboxd_network_received_bytes_total",
		"IP bytes the account's sandboxes on this node received on their networks.", []string{"account_id"}, nil)
)

// NetworkMetrics is a Prometheus collector of the network traffic of this
// node's sandboxes per account: the running ones' counters read at each
// scrape plus the ended ones' sums.
func (m *Manager) NetworkMetrics() prometheus.Collector { return networkCollector{m} }

type networkCollector struct{ m *Manager }

func (c networkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sentDesc
	ch <- receivedDesc
}

func (c networkCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.traffic.mu.Lock()
	sums := make(map[string]netpol.Traffic, len(m.traffic.ended))
	for a, t := range m.traffic.ended {
		sums[a] = t
	}
	m.traffic.mu.Unlock()
	if m.network != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rows, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, store.SandboxRunning)
		if err != nil {
			m.log.Warn("list sandboxes for network metrics", "err", err)
		}
		for _, sb := range rows {
			tr, err := m.network.Traffic(sb.ID)
			if err != nil || tr == nil {
				continue
			}
			sum := sums[sb.AccountID]
			sum.Add(*tr)
			sums[sb.AccountID] = sum
		}
	}
	for account, t := range sums {
		ch <- prometheus.MustNewConstMetric(sentDesc, prometheus.CounterValue, float64(t.TxBytes), account)
		ch <- prometheus.MustNewConstMetric(receivedDesc, prometheus.CounterValue, float64(t.RxBytes), account)
	}
}
