package blob

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Cache is a bounded read-through cache of another store's blobs in a
// directory on this node. It is meant for a store that many nodes share
// (S3): a sandbox start reads the account's layers, and reading them from
// local disk instead of the network is both faster and cheaper.
//
// Get serves a blob from the directory when it is there, verifying it as it
// is read like Local does. Otherwise it downloads the whole blob from the
// backing store into a temporary file, which becomes the cached copy once
// it hashed to its key, and then gives the caller that file. Concurrent
// Gets of a blob being downloaded do not download it again but wait for
// that download and read the cached copy (see Get).
//
// Put, PutKnown, Stat and List are the backing store's; Delete deletes from
// both. Keys are content addresses, so a cached copy never goes stale: the
// only way it can be wrong is damage, which verification catches.
//
// The directory holds at most maxBytes: cached blobs plus what downloads in
// progress may still write. Room is made by evicting the least recently
// used blobs (a reader of an evicted blob keeps its open file); a blob
// larger than the whole cache is streamed but not kept. The directory must
// belong to one Cache: NewCache deletes the temporary files it finds there.
//
// The layout is Local's: the blob "abcdef…" is <dir>/ab/cdef…, and
// downloads in progress are in <dir>/tmp.
type Cache struct {
	backing Store
	dir     string
	max     int64
	log     *slog.Logger

	mu        sync.Mutex
	entries   map[string]*cacheEntry // cached blobs by key
	lru       *list.List             // of *cacheEntry, most recently used first
	downloads map[string]*download   // Gets filling the cache, by key
	cached    int64                  // bytes of the entries
	reserved  int64                  // bytes the downloads may still write
	stats     CacheStats             // counters; Bytes and Blobs are computed
}

var _ Store = (*Cache)(nil)

// CacheStats counts what a Cache did since NewCache and says what it holds.
type CacheStats struct {
	Hits      int64 // Gets served from the cache directory
	Misses    int64 // Gets that read the backing store
	Evictions int64 // cached blobs removed to make room
	Damaged   int64 // cached blobs removed because they failed verification
	Bytes     int64 // bytes of the directory: cached blobs and downloads in progress
	Blobs     int   // blobs cached
}

// cacheEntry is a blob in the cache directory.
type cacheEntry struct {
	key  string
	size int64
	elem *list.Element // in Cache.lru
}

// download is the one Get of a key that reads it from the backing store
// while others wait. The fields other than done are guarded by Cache.mu,
// except f and n, which only the downloading Get uses.
type download struct {
	key  string
	done chan struct{} // closed when the download ends, kept or not
	// direct tells the Gets that waited that the blob is not being cached
	// (too large, no room, a disk error): each reads the backing store
	// itself instead of trying to cache it again, one after another.
	direct bool
	// doomed is set by a Delete of the key during the download, which must
	// then not leave a copy of a deleted blob behind.
	doomed   bool
	reserved int64 // bytes of Cache.reserved held for this download

	f *os.File // the temporary file, nil until created
	n int64    // bytes written to f
}

// NewCache opens a cache of backing's blobs in dir, holding at most
// maxBytes. It creates dir if needed, deletes the temporary files that an
// earlier process left there, and takes in the blobs already cached, the
// most recently modified as the most recently used, evicting the oldest if
// they exceed maxBytes. log may be nil.
func NewCache(backing Store, dir string, maxBytes int64, log *slog.Logger) (*Cache, error) {
	if backing == nil {
		return nil, errors.New("open blob cache: no backing store")
	}
	if maxBytes <= 0 {
		return nil, fmt.Errorf("open blob cache %s: size %d: want a positive number of bytes", dir, maxBytes)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cache{
		backing:   backing,
		dir:       dir,
		max:       maxBytes,
		log:       log,
		entries:   make(map[string]*cacheEntry),
		lru:       list.New(),
		downloads: make(map[string]*download),
	}
	// Only this cache writes to its temp directory, and it has not started:
	// whatever is there was left by a process that died mid-download.
	if err := os.RemoveAll(c.tmpDir()); err != nil {
		return nil, fmt.Errorf("open blob cache %s: remove leftover downloads: %w", dir, err)
	}
	if err := os.MkdirAll(c.tmpDir(), 0o755); err != nil {
		return nil, fmt.Errorf("open blob cache %s: %w", dir, err)
	}
	if err := c.load(); err != nil {
		return nil, fmt.Errorf("open blob cache %s: %w", dir, err)
	}
	log.Info("blob cache opened", "dir", dir, "blobs", len(c.entries), "bytes", c.cached, "max_bytes", maxBytes, "evicted", c.stats.Evictions)
	return c, nil
}

// load takes in the blobs in the directory. Their order of use is not
// recorded anywhere but in their times, which hits move forward.
func (c *Cache) load() error {
	type found struct {
		key      string
		size     int64
		modified time.Time
	}
	var blobs []found
	shards, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	for _, shard := range shards {
		if !shard.IsDir() || len(shard.Name()) != 2 {
			continue
		}
		files, err := os.ReadDir(filepath.Join(c.dir, shard.Name()))
		if err != nil {
			return err
		}
		for _, f := range files {
			key := shard.Name() + f.Name()
			if !f.Type().IsRegular() || !ValidKey(key) {
				continue // not ours: neither counted nor touched
			}
			fi, err := f.Info()
			if err != nil {
				return err
			}
			blobs = append(blobs, found{key, fi.Size(), fi.ModTime()})
		}
	}
	slices.SortFunc(blobs, func(a, b found) int { return a.modified.Compare(b.modified) })

	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range blobs { // oldest first, so the newest ends up in front
		e := &cacheEntry{key: b.key, size: b.size}
		e.elem = c.lru.PushFront(e)
		c.entries[b.key] = e
		c.cached += b.size
	}
	// The bound may have been lowered since the blobs were cached.
	for c.cached > c.max {
		c.removeLocked(c.lru.Back().Value.(*cacheEntry))
		c.stats.Evictions++
	}
	return nil
}

// Dir returns the cache directory.
func (c *Cache) Dir() string { return c.dir }

// MaxBytes is the most the cache directory holds.
func (c *Cache) MaxBytes() int64 { return c.max }

func (c *Cache) tmpDir() string { return filepath.Join(c.dir, "tmp") }

// path returns the file of a valid key.
func (c *Cache) path(key string) string {
	return filepath.Join(c.dir, key[:2], key[2:])
}

// Stats returns the cache's counters and contents.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Bytes = c.cached + c.reserved
	s.Blobs = len(c.entries)
	return s
}

// Get implements Store. A blob that is not cached is downloaded whole
// before Get returns; a Get of a blob that another Get is downloading waits
// for that download and reads the cached copy (or, when that download could
// not cache it, the backing store).
//
// Downloading in Get, rather than while the caller reads, means that no
// reader's pace holds up another: a caller may open the same blob twice
// before reading either, and two callers that open the same blobs in
// different orders cannot wait on each other.
func (c *Cache) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("get blob: %w", err)
	}
	for {
		c.mu.Lock()
		if e := c.entries[key]; e != nil {
			if rc := c.openLocked(e); rc != nil {
				c.stats.Hits++
				c.lru.MoveToFront(e.elem)
				c.mu.Unlock()
				// The file's time is the order of use a restart starts
				// from; not worth failing a read over.
				now := time.Now()
				_ = os.Chtimes(c.path(key), now, now)
				return rc, nil
			}
		}
		d := c.downloads[key]
		if d == nil {
			d = &download{key: key, done: make(chan struct{})}
			// Registered before the backing store is asked, so that a
			// Delete from now on finds it (see Delete).
			c.downloads[key] = d
			c.stats.Misses++
			c.mu.Unlock()
			return c.download(ctx, d)
		}
		c.mu.Unlock()
		select {
		case <-d.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("get blob %s: wait for its download: %w", key, ctx.Err())
		}
		if d.direct { // written before done was closed
			c.mu.Lock()
			c.stats.Misses++
			c.mu.Unlock()
			return c.getDirect(ctx, key)
		}
		// Cached by now, or the download failed and this Get may be the
		// one to try again.
	}
}

// getDirect opens key in the backing store, verified, bypassing the cache.
func (c *Cache) getDirect(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := c.backing.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return verified(rc, key), nil
}

// openLocked opens the cached copy e, or returns nil when it cannot, so
// that the blob is downloaded again. A copy whose file is gone or has the
// wrong size is removed: damage found before any byte is read costs the
// caller nothing. One that cannot be opened for another reason (say, out of
// file descriptors) is left, and replaced if the download is kept.
func (c *Cache) openLocked(e *cacheEntry) io.ReadCloser {
	f, err := os.Open(c.path(e.key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			c.log.Warn("blob cache: a cached blob's file is gone", "key", e.key)
			c.removeLocked(e)
			c.stats.Damaged++
		} else {
			c.log.Warn("blob cache: open cached blob", "key", e.key, "err", err)
		}
		return nil
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() != e.size {
		c.log.Warn("blob cache: dropping a damaged cached blob", "key", e.key, "bytes", fi.Size(), "want_bytes", e.size)
		c.removeLocked(e)
		c.stats.Damaged++
		f.Close()
		return nil
	}
	if err != nil {
		c.log.Warn("blob cache: open cached blob", "key", e.key, "err", err)
		f.Close()
		return nil
	}
	return &hitReader{c: c, e: e, r: newVerifyingReader(f, e.key, e.size)}
}

// download reads d's blob from the backing store into its temporary file
// to the verified end, publishes it and returns it to the caller. A blob
// that cannot be cached (too large, no room, a disk error) is read from the
// backing store directly, by this caller and by those waiting.
func (c *Cache) download(ctx context.Context, d *download) (io.ReadCloser, error) {
	rc, err := c.backing.Get(ctx, d.key)
	if err != nil {
		c.end(d, false)
		return nil, err
	}
	vr := verified(rc, d.key)
	if err := c.start(d, vr.size); err != nil {
		c.log.Debug("blob cache: streaming a blob without caching it", "key", d.key, "size", vr.size, "err", err)
		c.end(d, true)
		return vr, nil
	}
	w := &downloadWriter{c: c, d: d}
	_, err = io.Copy(w, vr)
	vr.Close()
	switch {
	case w.err != nil:
		if errors.Is(w.err, errTooLarge) {
			c.log.Debug("blob cache: reading a blob without caching it", "key", d.key, "err", w.err)
		} else {
			c.log.Warn("blob cache: not keeping a downloaded blob", "key", d.key, "err", w.err)
		}
		c.end(d, true)
		return c.getDirect(ctx, d.key)
	case err != nil:
		// A failed read may be the network's: a waiting Get tries again.
		c.end(d, false)
		return nil, fmt.Errorf("get blob %s: %w", d.key, err)
	}
	return c.commit(d)
}

// downloadWriter writes a download to its temporary file and keeps the
// error it met, which tells a full cache or disk from a failed read.
type downloadWriter struct {
	c   *Cache
	d   *download
	err error
}

func (w *downloadWriter) Write(p []byte) (int, error) {
	if w.err = w.c.write(w.d, p); w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// verified returns rc as a reader that verifies key's content. The stores
// of this package verify already; others are wrapped.
func verified(rc io.ReadCloser, key string) *verifyingReader {
	if vr, ok := rc.(*verifyingReader); ok {
		return vr
	}
	return newVerifyingReader(rc, key, -1)
}

// errTooLarge says that a blob cannot be cached because it is larger than
// the cache, or than what downloads in progress leave of it.
var errTooLarge = errors.New("blob does not fit in the cache")

// start reserves room for a download of size bytes (-1: unknown, reserved
// as it is written) and creates its temporary file.
func (c *Cache) start(d *download, size int64) error {
	if size > 0 {
		c.mu.Lock()
		ok := c.reserveLocked(d, size)
		c.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w: %d bytes", errTooLarge, size)
		}
	}
	f, err := os.CreateTemp(c.tmpDir(), "get-*")
	if err != nil {
		return fmt.Errorf("create download file: %w", err)
	}
	d.f = f
	return nil
}

// write adds p to d's temporary file, reserving more room first when the
// blob's size was not known.
func (c *Cache) write(d *download, p []byte) error {
	if more := d.n + int64(len(p)) - d.reserved; more > 0 {
		c.mu.Lock()
		ok := c.reserveLocked(d, more)
		c.mu.Unlock()
		if !ok {
			return fmt.Errorf("%w: more than %d bytes", errTooLarge, d.n)
		}
	}
	n, err := d.f.Write(p)
	d.n += int64(n)
	if err != nil {
		return fmt.Errorf("write %s: %w", d.f.Name(), err)
	}
	return nil
}

// reserveLocked makes room for n more bytes of d, evicting the least
// recently used blobs, or reports that there can be none: the download
// would outgrow the cache, or other downloads hold the room. It evicts
// nothing in vain.
func (c *Cache) reserveLocked(d *download, n int64) bool {
	if d.reserved+n > c.max || c.reserved+n > c.max {
		return false
	}
	for c.cached+c.reserved+n > c.max {
		// Cannot run out: the entries are all that is left above
		// c.reserved+n <= c.max.
		c.removeLocked(c.lru.Back().Value.(*cacheEntry))
		c.stats.Evictions++
	}
	c.reserved += n
	d.reserved += n
	return true
}

// removeLocked forgets e and deletes its file. Readers that have it open
// read on: on Linux an unlinked file lives until its last descriptor is
// closed. The file is deleted under the lock so that a later download of
// the same key cannot be published first and then deleted in its place.
func (c *Cache) removeLocked(e *cacheEntry) {
	delete(c.entries, e.key)
	c.lru.Remove(e.elem)
	c.cached -= e.size
	if err := os.Remove(c.path(e.key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("blob cache: delete cached blob", "key", e.key, "err", err)
	}
}

// commit publishes d's temporary file, complete and verified, as the
// cached copy of its key, ends d, and returns the file to be read from its
// start. A copy that cannot be kept (a Delete during the download, a disk
// error) is still the caller's to read: its Get came first.
func (c *Cache) commit(d *download) (io.ReadCloser, error) {
	f := d.f
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		c.end(d, false)
		return nil, fmt.Errorf("get blob %s: rewind the download: %w", d.key, err)
	}
	d.f = nil
	tmp := f.Name()
	// Read-only marks what must never change. No fsync: a copy damaged by
	// a crash fails verification and is fetched again, and syncing would
	// hold up the caller.
	err := f.Chmod(0o444)

	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
	case d.doomed:
		err = errors.New("deleted during the download")
	default:
		if old := c.entries[d.key]; old != nil {
			c.removeLocked(old) // not expected: one download per key
		}
		dst := c.path(d.key)
		if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
			err = os.Rename(tmp, dst)
		}
	}
	c.reserved -= d.reserved
	if err != nil {
		if d.doomed {
			c.log.Debug("blob cache: not keeping a blob deleted during its download", "key", d.key)
		} else {
			c.log.Warn("blob cache: not keeping a downloaded blob", "key", d.key, "err", err)
		}
		os.Remove(tmp) // the open file reads on
		c.finishLocked(d, false)
		return f, nil
	}
	e := &cacheEntry{key: d.key, size: d.n}
	e.elem = c.lru.PushFront(e)
	c.entries[d.key] = e
	// d reserved its size, or exactly what it wrote: the total stays in
	// bounds.
	c.cached += d.n
	c.finishLocked(d, false)
	return f, nil
}

// end abandons d: its temporary file is deleted and its room given back.
// With direct, the Gets waiting for it read the backing store themselves.
func (c *Cache) end(d *download, direct bool) {
	if d.f != nil {
		d.f.Close()
		os.Remove(d.f.Name())
		d.f = nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reserved -= d.reserved
	c.finishLocked(d, direct)
}

func (c *Cache) finishLocked(d *download, direct bool) {
	d.reserved = 0
	d.direct = direct
	delete(c.downloads, d.key)
	close(d.done)
}

// Put implements Store. Only the backing store keeps the blob: its size is
// not known before it has been read, so caching it could push out the
// whole cache for a blob that turns out not to fit.
func (c *Cache) Put(ctx context.Context, r io.Reader) (Info, error) {
	return c.backing.Put(ctx, r)
}

// PutKnown implements Store, storing in the backing store only.
func (c *Cache) PutKnown(ctx context.Context, key string, size int64, r io.Reader) error {
	return c.backing.PutKnown(ctx, key, size, r)
}

// Stat implements Store: what the backing store says, which is what counts
// even for a cached blob.
func (c *Cache) Stat(ctx context.Context, key string) (Info, error) {
	return c.backing.Stat(ctx, key)
}

// List implements Store, listing the backing store.
func (c *Cache) List(ctx context.Context, fn func(Info) error) error {
	return c.backing.List(ctx, fn)
}

// Delete implements Store, deleting the blob from the backing store and
// from the cache.
func (c *Cache) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("delete blob: %w", err)
	}
	// The backing store first: a download that starts after it cannot find
	// the blob, and one that started before is registered by now, so it is
	// told below not to keep what it read. The cached copy goes even if the
	// backing store failed: dropping a copy is always safe.
	err := c.backing.Delete(ctx, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.downloads[key]; d != nil {
		d.doomed = true
	}
	if e := c.entries[key]; e != nil {
		c.removeLocked(e)
	}
	return err
}

// hitReader reads a cached copy, verifying it, and drops the copy when it
// turns out damaged.
type hitReader struct {
	c   *Cache
	e   *cacheEntry
	r   *verifyingReader
	err error // the damage, once found
}

func (h *hitReader) Read(p []byte) (int, error) {
	if h.err != nil {
		return 0, h.err
	}
	n, err := h.r.Read(p)
	if errors.Is(err, ErrCorrupt) {
		// Too late for this reader, which has had the bytes; the next Get
		// downloads the blob again.
		h.c.dropDamaged(h.e, err)
		h.err = fmt.Errorf("cached copy: %w (dropped: it will be read from the backing store again)", err)
		return n, h.err
	}
	return n, err
}

func (h *hitReader) Close() error { return h.r.Close() }

// dropDamaged removes e unless it has been replaced already.
func (c *Cache) dropDamaged(e *cacheEntry, err error) {
	c.log.Warn("blob cache: dropping a damaged cached blob", "key", e.key, "err", err)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[e.key] == e {
		c.removeLocked(e)
		c.stats.Damaged++
	}
}
