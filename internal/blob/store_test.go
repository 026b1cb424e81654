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
