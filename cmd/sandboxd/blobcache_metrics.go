package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/blob"
)

var (
	blobCacheBytesDesc = prometheus.NewDesc("sandboxd_blob_cache_bytes",
		"Bytes of the node's layer cache directory: cached layers and downloads in progress.", nil, nil)
	blobCacheBlobsDesc = prometheus.NewDesc("sandboxd_blob_cache_blobs",
		"Layers in the node's layer cache.", nil, nil)
	blobCacheEventsDesc = prometheus.NewDesc("sandboxd_blob_cache_total",
		"What the node's layer cache did: hit (read from local disk), miss (read from the shared store), eviction (least recently used, for room), damaged (a copy that failed its hash, dropped).", []string{"event"}, nil)
)

// blobCacheCollector exposes a layer cache's counters on /metrics: its
// hit ratio is what tells an operator whether --blob-cache-mib is large
// enough for the accounts a node serves.
type blobCacheCollector struct{ c *blob.Cache }

func (bc blobCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- blobCacheBytesDesc
	ch <- blobCacheBlobsDesc
	ch <- blobCacheEventsDesc
}

func (bc blobCacheCollector) Collect(ch chan<- prometheus.Metric) {
	st := bc.c.Stats()
	ch <- prometheus.MustNewConstMetric(blobCacheBytesDesc, prometheus.GaugeValue, float64(st.Bytes))
	ch <- prometheus.MustNewConstMetric(blobCacheBlobsDesc, prometheus.GaugeValue, float64(st.Blobs))
	for event, n := range map[string]int64{"hit": st.Hits, "miss": st.Misses, "eviction": st.Evictions, "damaged": st.Damaged} {
		ch <- prometheus.MustNewConstMetric(blobCacheEventsDesc, prometheus.CounterValue, float64(n), event)
	}
}
