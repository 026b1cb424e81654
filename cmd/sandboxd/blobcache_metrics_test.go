package main

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sandboxd/sandboxd/internal/blob"
)

func TestBlobCacheMetrics(t *testing.T) {
	backing, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c, err := blob.NewCache(backing, t.TempDir(), 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Put(t.Context(), bytes.NewReader([]byte("a layer")))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		rc, err := c.Get(t.Context(), info.Key)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, rc)
		rc.Close()
	}
	want := `
# HELP sandboxd_blob_cache_blobs Layers in the node's layer cache.
# TYPE sandboxd_blob_cache_blobs gauge
sandboxd_blob_cache_blobs 1
# HELP sandboxd_blob_cache_total What the node's layer cache did: hit (read from local disk), miss (read from the shared store), eviction (least recently used, for room), damaged (a copy that failed its hash, dropped).
# TYPE sandboxd_blob_cache_total counter
sandboxd_blob_cache_total{event="damaged"} 0
sandboxd_blob_cache_total{event="eviction"} 0
sandboxd_blob_cache_total{event="hit"} 1
sandboxd_blob_cache_total{event="miss"} 1
`
	if err := testutil.CollectAndCompare(blobCacheCollector{c}, strings.NewReader(want), "sandboxd_blob_cache_blobs", "sandboxd_blob_cache_total"); err != nil {
		t.Fatal(err)
	}
}
