package main

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/store"
)

// storageOptions are the flags of where snapshots are kept (the database
// and the data dir are the root's --database and --data-dir).
type storageOptions struct {
	blobURL      string
	blobCacheMiB int64
}

func (o *storageOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.blobURL, "blob-store", "", "where snapshots are stored: empty for DATA_DIR/blobs, or s3://ACCESS:SECRET@host:port/bucket/prefix?tls=false (env SANDBOXD_BLOB_STORE)")
	f.Int64Var(&o.blobCacheMiB, "blob-cache-mib", 4096, "MiB of snapshot layers read from an S3 --blob-store that are kept in DATA_DIR/cache/blobs, least recently used evicted first; 0 disables (env SANDBOXD_BLOB_CACHE_MIB)")
}

func (o *storageOptions) check() error {
	return atLeast("blob-cache-mib", o.blobCacheMiB, 0, "0 (no cache) or more")
}

// storage is where this node keeps its state.
type storage struct {
	dataDir string // absolute
	nodeID  string
	st      *store.Store
	blobs   blob.Store
	// cache is the layer cache in front of an S3 blob store (nil: none).
	cache *blob.Cache
}

// cacheBytes is what the layer cache may take of the data dir's disk (0
// without one): the disk admission must not promise it to sandboxes.
func (s *storage) cacheBytes() int64 {
	if s.cache == nil {
		return 0
	}
	return s.cache.MaxBytes()
}

// setupStorage opens (and migrates) the database and opens the blob store,
// cached when it is a shared remote one; the cleanup closes the database.
func setupStorage(ctx context.Context, g *globals, o storageOptions, dataDir, nodeID string, log *slog.Logger) (*storage, func(), error) {
	st, err := g.openStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	s := &storage{dataDir: dataDir, nodeID: nodeID, st: st}
	if s.blobs, err = blob.Open(ctx, o.blobURL, dataDir); err != nil {
		st.Close()
		return nil, nil, flagErrorf("blob-store", "--blob-store: %w", err)
	}
	// A local store is local already: only a shared remote one is cached.
	if s3, ok := s.blobs.(*blob.S3); ok && o.blobCacheMiB != 0 {
		if s.cache, err = blob.NewCache(s3, filepath.Join(dataDir, "cache", "blobs"), o.blobCacheMiB<<20, log.With("component", "blobcache")); err != nil {
			st.Close()
			return nil, nil, err // says "open blob cache DIR" already
		}
		s.blobs = s.cache
	}
	return s, func() { st.Close() }, nil
}

// homeSocket is the unix socket of the way home from inside sandboxes
// (http://sandboxd.internal).
func (s *storage) homeSocket() string { return filepath.Join(s.dataDir, "sandboxd.sock") }
