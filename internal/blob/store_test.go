package blob_test

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobtest"
)

func TestLocalConformance(t *testing.T) {
	store, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	blobtest.Run(t, store)
}

func TestS3Conformance(t *testing.T) {
	url := blobtest.StartS3(t)
	store, err := blob.Open(t.Context(), url, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := store.(*blob.S3); !ok {
		t.Fatalf("Open(%q) = %T, want *blob.S3", url, store)
	}
	blobtest.Run(t, store)
}

// A Cache must behave as a Store, whether it keeps the blobs (a cache
// larger than the suite's) or mostly cannot (one smaller than most of its
// blobs, so that blobs are streamed without being kept and evicted often).
func TestCacheConformance(t *testing.T) {
	for _, tt := range []struct {
		name     string
		maxBytes int64
	}{
		{"roomy", 1 << 30},
		{"cramped", 256 << 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			backing, err := blob.NewLocal(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			cache, err := blob.NewCache(backing, t.TempDir(), tt.maxBytes, nil)
			if err != nil {
				t.Fatal(err)
			}
			blobtest.Run(t, cache)
			if st := cache.Stats(); st.Bytes > tt.maxBytes {
				t.Errorf("cache holds %d bytes, more than its %d", st.Bytes, tt.maxBytes)
			}
		})
	}
}
