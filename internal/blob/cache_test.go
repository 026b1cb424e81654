package blob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingStore is a backing store that counts its Gets and can hold them
// until a gate opens.
type countingStore struct {
	Store
	gets atomic.Int64
	// entered, when set, receives a value as each Get starts; gate, when
	// set, is waited for before each Get asks the store.
	entered chan struct{}
	gate    chan struct{}
	// hideSize wraps readers in a type the cache does not know, so that it
	// learns a blob's size only by reading it.
	hideSize bool
}

func (s *countingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.gets.Add(1)
	if s.entered != nil {
		s.entered <- struct{}{}
	}
	if s.gate != nil {
		<-s.gate
	}
	rc, err := s.Store.Get(ctx, key)
	if err != nil || !s.hideSize {
		return rc, err
	}
	return struct{ io.ReadCloser }{rc}, nil
}

// newTestCache returns a cache of maxBytes over a fresh Local wrapped in a
// countingStore.
func newTestCache(t *testing.T, maxBytes int64) (*Cache, *countingStore) {
	t.Helper()
	backing := &countingStore{Store: newTestLocal(t)}
	c, err := NewCache(backing, t.TempDir(), maxBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, backing
}

// putBlobs stores blobs of size bytes in s and returns their contents and
// keys.
func putBlobs(t *testing.T, s Store, n, size int) ([][]byte, []string) {
	t.Helper()
	contents := make([][]byte, n)
	keys := make([]string, n)
	for i := range n {
		contents[i] = bytes.Repeat([]byte{byte('a' + i)}, size)
		contents[i] = fmt.Appendf(contents[i], "blob %d", i)
		info, err := s.Put(t.Context(), bytes.NewReader(contents[i]))
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = info.Key
	}
	return contents, keys
}

func closeAll(rcs []io.ReadCloser) {
	for _, rc := range rcs {
		rc.Close()
	}
}

// mustGet reads key through c to its end and checks the content.
func mustGet(t *testing.T, c Store, key string, want []byte) {
	t.Helper()
	got, err := readBlob(t, c, key)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %s: %d bytes, not the %d stored", key, len(got), len(want))
	}
}

// cacheFiles returns the regular files under the cache directory and their
// total size, temporary files included.
func cacheFiles(t *testing.T, c *Cache) (map[string]int64, int64) {
	t.Helper()
	files := make(map[string]int64)
	var total int64
	err := filepath.WalkDir(c.Dir(), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(c.Dir(), p)
		files[rel] = fi.Size()
		total += fi.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, total
}

func isCached(t *testing.T, c *Cache, key string) bool {
	t.Helper()
	_, err := os.Stat(c.path(key))
	return err == nil
}

func TestCacheHitAfterMiss(t *testing.T) {
	c, backing := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 1, 10000)
	for range 3 {
		mustGet(t, c, keys[0], contents[0])
	}
	if n := backing.gets.Load(); n != 1 {
		t.Fatalf("backing store read %d times, want once", n)
	}
	if !isCached(t, c, keys[0]) {
		t.Fatal("no cached file after a miss")
	}
	st := c.Stats()
	if st.Hits != 2 || st.Misses != 1 || st.Blobs != 1 || st.Bytes != int64(len(contents[0])) {
		t.Fatalf("Stats = %+v, want 2 hits, 1 miss, 1 blob of %d bytes", st, len(contents[0]))
	}
	if files, _ := cacheFiles(t, c); len(files) != 1 {
		t.Fatalf("cache directory holds %v, want the one blob", files)
	}
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	const size = 1000
	// Room for three blobs, not four (each is size plus a few bytes).
	c, backing := newTestCache(t, 3*size+100)
	contents, keys := putBlobs(t, c, 4, size)
	for i := range 3 {
		mustGet(t, c, keys[i], contents[i])
	}
	mustGet(t, c, keys[0], contents[0]) // 1 is now the least recently used
	mustGet(t, c, keys[3], contents[3])
	for i, want := range []bool{true, false, true, true} {
		if got := isCached(t, c, keys[i]); got != want {
			t.Errorf("blob %d cached = %v, want %v", i, got, want)
		}
	}
	st := c.Stats()
	if st.Evictions != 1 || st.Blobs != 3 {
		t.Errorf("Stats = %+v, want 1 eviction, 3 blobs", st)
	}
	if _, total := cacheFiles(t, c); total > c.max || st.Bytes != total {
		t.Errorf("cache directory holds %d bytes, Stats says %d, bound %d", total, st.Bytes, c.max)
	}
	before := backing.gets.Load()
	mustGet(t, c, keys[1], contents[1])
	if backing.gets.Load() != before+1 {
		t.Error("an evicted blob was not read from the backing store")
	}
}

// A damaged cached copy is found, dropped and read again from the backing
// store: before the caller gets any byte when its size is wrong, at the
// end of the read (which fails, as it must) when only its bytes are.
func TestCacheDamagedCopy(t *testing.T) {
	tests := []struct {
		name        string
		damage      func([]byte) []byte
		firstFails  bool // the first read after the damage fails
		wantDamaged int64
	}{
		{"flipped byte", func(b []byte) []byte { b[len(b)/2] ^= 1; return b }, true, 1},
		{"truncated", func(b []byte) []byte { return b[:len(b)-1] }, false, 1},
		{"extended", func(b []byte) []byte { return append(b, 'x') }, false, 1},
		{"emptied", func([]byte) []byte { return nil }, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, backing := newTestCache(t, 1<<20)
			contents, keys := putBlobs(t, c, 1, 50000)
			key, content := keys[0], contents[0]
			mustGet(t, c, key, content)
			path := c.path(key)
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tt.damage(bytes.Clone(content)), 0o644); err != nil {
				t.Fatal(err)
			}

			got, err := readBlob(t, c, key)
			if tt.firstFails {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("reading a damaged cached copy: %v, want ErrCorrupt", err)
				}
				if isCached(t, c, key) {
					t.Fatal("the damaged copy was kept")
				}
				mustGet(t, c, key, content)
			} else if err != nil || !bytes.Equal(got, content) {
				t.Fatalf("reading a cached copy of the wrong size: %d bytes, %v; want the blob from the backing store", len(got), err)
			}
			if n := backing.gets.Load(); n != 2 {
				t.Errorf("backing store read %d times, want twice", n)
			}
			if st := c.Stats(); st.Damaged != tt.wantDamaged {
				t.Errorf("Stats = %+v, want %d damaged", st, tt.wantDamaged)
			}
			// The copy fetched again is good and used.
			mustGet(t, c, key, content)
			if n := backing.gets.Load(); n != 2 {
				t.Errorf("backing store read %d times after the repair, want twice", n)
			}
		})
	}
}

// A cached copy whose file someone removed is downloaded again.
func TestCacheFileGone(t *testing.T) {
	c, backing := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 1, 1000)
	mustGet(t, c, keys[0], contents[0])
	if err := os.Remove(c.path(keys[0])); err != nil {
		t.Fatal(err)
	}
	mustGet(t, c, keys[0], contents[0])
	if n := backing.gets.Load(); n != 2 {
		t.Fatalf("backing store read %d times, want twice", n)
	}
	if !isCached(t, c, keys[0]) {
		t.Fatal("the blob downloaded again was not kept")
	}
	if st := c.Stats(); st.Blobs != 1 || st.Bytes != int64(len(contents[0])) {
		t.Fatalf("Stats = %+v, want the one blob counted once", st)
	}
}

// A reader that stops before the end leaves no file behind and no room
// held.
// Get downloads the whole blob, so a reader that stops early still leaves
// it cached.
func TestCacheGetDownloadsWholeBlob(t *testing.T) {
	c, backing := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 1, 100000)
	rc, err := c.Get(t.Context(), keys[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, rc, 10000); err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Fatal(err)
	}
	if !isCached(t, c, keys[0]) {
		t.Fatal("a blob read in part was not cached")
	}
	if files, _ := cacheFiles(t, c); len(files) != 1 {
		t.Fatalf("cache directory holds %v, want the one blob", files)
	}
	mustGet(t, c, keys[0], contents[0])
	if n := backing.gets.Load(); n != 1 {
		t.Fatalf("backing store read %d times, want once", n)
	}
}

// A backing store reader that fails midway leaves nothing.
func TestCacheFailedDownloadLeavesNothing(t *testing.T) {
	c, _ := newTestCache(t, 1<<20)
	content := []byte(strings.Repeat("x", 5000))
	key := Key(content)
	broken := &brokenStore{Store: c.backing, content: content, at: 3000}
	c.backing = broken
	if _, err := readBlob(t, c, key); !errors.Is(err, errBrokenRead) {
		t.Fatalf("read from a failing backing store: %v, want its error", err)
	}
	if files, _ := cacheFiles(t, c); len(files) != 0 {
		t.Fatalf("a failed download left %v", files)
	}
	if st := c.Stats(); st.Bytes != 0 {
		t.Fatalf("Stats = %+v, want no bytes held", st)
	}
}

var errBrokenRead = errors.New("connection reset")

// brokenStore serves content under its key but fails after at bytes.
type brokenStore struct {
	Store
	content []byte
	at      int
}

func (s *brokenStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	r := io.MultiReader(bytes.NewReader(s.content[:s.at]), errReader{errBrokenRead})
	return io.NopCloser(r), nil
}

func TestCacheConcurrentGetsDownloadOnce(t *testing.T) {
	for _, hideSize := range []bool{false, true} {
		t.Run(fmt.Sprintf("size hidden %v", hideSize), func(t *testing.T) {
			const readers = 8
			c, backing := newTestCache(t, 1<<20)
			contents, keys := putBlobs(t, c, 1, 200000)
			backing.entered = make(chan struct{}, readers)
			backing.gate = make(chan struct{})
			backing.hideSize = hideSize

			errs := make(chan error, readers)
			read := func() {
				got, err := readBlob(t, c, keys[0])
				if err == nil && !bytes.Equal(got, contents[0]) {
					err = fmt.Errorf("read %d bytes, not the %d stored", len(got), len(contents[0]))
				}
				errs <- err
			}
			// The first Get downloads; it is held in the backing store
			// while the others start and, most likely, wait for it. Those
			// that come later find the blob cached: either way, one
			// download.
			go read()
			<-backing.entered
			for range readers - 1 {
				go read()
			}
			time.Sleep(50 * time.Millisecond)
			close(backing.gate)
			for range readers {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if n := backing.gets.Load(); n != 1 {
				t.Fatalf("%d concurrent Gets read the backing store %d times, want once", readers, n)
			}
			if st := c.Stats(); st.Misses != 1 || st.Hits != readers-1 {
				t.Fatalf("Stats = %+v, want 1 miss, %d hits", st, readers-1)
			}
		})
	}
}

// A caller may open the same blob twice before reading either (a snapshot
// chain can hold one layer twice) and read them in turn.
func TestCacheSameBlobTwiceInOneCaller(t *testing.T) {
	c, backing := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 1, 30000)
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			var rcs []io.ReadCloser
			defer func() { closeAll(rcs) }()
			for range 2 {
				rc, err := c.Get(t.Context(), keys[0])
				if err != nil {
					return err
				}
				rcs = append(rcs, rc)
			}
			for _, rc := range rcs {
				got, err := io.ReadAll(rc)
				if err != nil {
					return err
				}
				if !bytes.Equal(got, contents[0]) {
					return errors.New("wrong content")
				}
			}
			return nil
		}()
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("opening a blob twice and reading the readers in turn hangs")
	}
	if n := backing.gets.Load(); n != 1 {
		t.Fatalf("backing store read %d times, want once", n)
	}
}

// Two callers that open the same two blobs in opposite orders, reading
// neither before both are open, do not wait on each other. (Readers that
// downloaded while they were read could: each waits for a download the
// other would only read on after.)
func TestCacheOppositeOrdersDoNotDeadlock(t *testing.T) {
	c, _ := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 2, 300000)
	open := func(order []int) error {
		var rcs []io.ReadCloser
		defer func() { closeAll(rcs) }()
		for _, i := range order {
			rc, err := c.Get(t.Context(), keys[i])
			if err != nil {
				return err
			}
			rcs = append(rcs, rc)
		}
		for j, rc := range rcs {
			got, err := io.ReadAll(rc)
			if err != nil {
				return err
			}
			if !bytes.Equal(got, contents[order[j]]) {
				return errors.New("wrong content")
			}
		}
		return nil
	}
	done := make(chan error, 2)
	go func() { done <- open([]int{0, 1}) }()
	go func() { done <- open([]int{1, 0}) }()
	for range 2 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("two callers opening the same blobs in opposite orders hang")
		}
	}
}

// When the download others wait for fails, one of them downloads the blob
// instead and caches it.
func TestCacheWaiterTakesOverFailedDownload(t *testing.T) {
	c, _ := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 1, 30000)
	flaky := &flakyStore{Store: c.backing, entered: make(chan struct{}, 1), gate: make(chan struct{})}
	c.backing = flaky
	first := make(chan error, 1)
	go func() {
		_, err := readBlob(t, c, keys[0])
		first <- err
	}()
	<-flaky.entered
	second := make(chan error, 1)
	go func() {
		got, err := readBlob(t, c, keys[0])
		if err == nil && !bytes.Equal(got, contents[0]) {
			err = errors.New("wrong content")
		}
		second <- err
	}()
	time.Sleep(20 * time.Millisecond) // most likely waiting by now
	close(flaky.gate)
	if err := <-first; !errors.Is(err, errBrokenRead) {
		t.Fatalf("first Get: %v, want the backing store's error", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("second Get: %v", err)
	}
	if n := flaky.gets.Load(); n != 2 {
		t.Fatalf("backing store read %d times, want twice", n)
	}
	if !isCached(t, c, keys[0]) {
		t.Fatal("the second download was not kept")
	}
}

// flakyStore's first Get waits for gate and then fails midway; the others
// are its Store's.
type flakyStore struct {
	Store
	gets    atomic.Int64
	entered chan struct{}
	gate    chan struct{}
}

func (s *flakyStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if s.gets.Add(1) > 1 {
		return s.Store.Get(ctx, key)
	}
	s.entered <- struct{}{}
	<-s.gate
	return io.NopCloser(io.MultiReader(strings.NewReader("partial"), errReader{errBrokenRead})), nil
}

// A Get waiting for another's download gives up when its context ends.
func TestCacheWaiterContext(t *testing.T) {
	c, backing := newTestCache(t, 1<<20)
	_, keys := putBlobs(t, c, 1, 30000)
	backing.entered = make(chan struct{}, 1)
	backing.gate = make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := readBlob(t, c, keys[0])
		first <- err
	}()
	<-backing.entered
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, keys[0]); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get waiting for a stalled download: %v, want the context's error", err)
	}
	close(backing.gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

func TestCacheTooLargeIsStreamedNotKept(t *testing.T) {
	for _, hideSize := range []bool{false, true} {
		t.Run(fmt.Sprintf("size hidden %v", hideSize), func(t *testing.T) {
			const bound = 10000
			c, backing := newTestCache(t, bound)
			backing.hideSize = hideSize
			contents, keys := putBlobs(t, c, 2, 4000)
			mustGet(t, c, keys[0], contents[0]) // cached, and must stay
			big, err := c.Put(t.Context(), bytes.NewReader(bytes.Repeat([]byte("big"), bound)))
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				rc, err := c.Get(t.Context(), big.Key)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || int64(len(got)) != big.Size {
					t.Fatalf("read of a blob larger than the cache: %d bytes, %v", len(got), err)
				}
			}
			// A blob whose size is learnt only by reading it is read once
			// into the cache until it no longer fits, and then again.
			want := int64(3)
			if hideSize {
				want = 5
			}
			if n := backing.gets.Load(); n != want {
				t.Errorf("backing store read %d times, want %d", n, want)
			}
			if isCached(t, c, big.Key) {
				t.Error("a blob larger than the cache was kept")
			}
			if !hideSize && !isCached(t, c, keys[0]) {
				// With its size known up front, a blob that cannot fit
				// evicts nothing.
				t.Error("a blob larger than the cache evicted another")
			}
			files, total := cacheFiles(t, c)
			if total > bound {
				t.Errorf("cache directory holds %d bytes (%v), bound %d", total, files, bound)
			}
		})
	}
}

// A Delete during a download keeps the downloaded copy out of the cache:
// it would be a copy of a deleted blob. The Get that came before the Delete
// still reads it.
func TestCacheDeleteDuringDownload(t *testing.T) {
	c, _ := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 1, 30000)
	paused := &pausingStore{Store: c.backing, at: 1000, reached: make(chan struct{}), gate: make(chan struct{})}
	c.backing = paused
	got := make(chan error, 1)
	go func() {
		b, err := readBlob(t, c, keys[0])
		if err == nil && !bytes.Equal(b, contents[0]) {
			err = fmt.Errorf("read %d bytes, not the %d stored", len(b), len(contents[0]))
		}
		got <- err
	}()
	<-paused.reached
	if err := c.Delete(t.Context(), keys[0]); err != nil {
		t.Fatal(err)
	}
	close(paused.gate)
	// Local's open file outlives its unlinking.
	if err := <-got; err != nil {
		t.Fatalf("Get begun before the Delete: %v", err)
	}
	if files, _ := cacheFiles(t, c); len(files) != 0 {
		t.Fatalf("cache directory after Delete holds %v", files)
	}
	if st := c.Stats(); st.Bytes != 0 || st.Blobs != 0 {
		t.Fatalf("Stats after Delete = %+v, want nothing held", st)
	}
}

// pausingStore's readers stop after at bytes until gate is closed, saying
// so on reached.
type pausingStore struct {
	Store
	at      int64
	reached chan struct{}
	gate    chan struct{}
}

func (s *pausingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := s.Store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	head := io.LimitReader(rc, s.at)
	pause := readerFunc(func([]byte) (int, error) {
		close(s.reached)
		<-s.gate
		return 0, io.EOF
	})
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(head, pause, rc), rc}, nil
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func TestCacheDeleteDropsCachedCopy(t *testing.T) {
	c, _ := newTestCache(t, 1<<20)
	contents, keys := putBlobs(t, c, 2, 1000)
	mustGet(t, c, keys[0], contents[0])
	mustGet(t, c, keys[1], contents[1])
	if err := c.Delete(t.Context(), keys[0]); err != nil {
		t.Fatal(err)
	}
	if isCached(t, c, keys[0]) || !isCached(t, c, keys[1]) {
		t.Fatal("Delete did not drop exactly its blob from the cache")
	}
	if st := c.Stats(); st.Blobs != 1 || st.Bytes != int64(len(contents[1])) {
		t.Fatalf("Stats after Delete = %+v", st)
	}
}

// NewCache takes in what an earlier process cached, oldest first out,
// removes its leftover downloads and keeps to a bound that was lowered.
func TestNewCacheTakesInTheDirectory(t *testing.T) {
	backing := &countingStore{Store: newTestLocal(t)}
	dir := t.TempDir()
	c, err := NewCache(backing, dir, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	contents, keys := putBlobs(t, c, 4, 1000)
	for i := range 4 {
		mustGet(t, c, keys[i], contents[i])
	}
	// Times a restart must go by: 1 is the newest, then 3, 0, 2.
	base := time.Now().Add(-time.Hour)
	for i, age := range []time.Duration{3, 1, 4, 2} {
		at := base.Add(-age * time.Minute)
		if err := os.Chtimes(c.path(keys[i]), at, at); err != nil {
			t.Fatal(err)
		}
	}
	leftover := filepath.Join(dir, "tmp", "get-123")
	if err := os.WriteFile(leftover, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	stranger := filepath.Join(dir, "README")
	if err := os.WriteFile(stranger, []byte("not a blob"), 0o644); err != nil {
		t.Fatal(err)
	}

	// Room for three of the four.
	c, err = NewCache(backing, dir, 3*1010, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftover); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("leftover download: %v, want it removed", err)
	}
	if _, err := os.Stat(stranger); err != nil {
		t.Errorf("a file that is not the cache's: %v, want it left alone", err)
	}
	for i, want := range []bool{true, true, false, true} {
		if got := isCached(t, c, keys[i]); got != want {
			t.Errorf("blob %d cached = %v, want %v (the oldest goes)", i, got, want)
		}
	}
	st := c.Stats()
	if st.Blobs != 3 || st.Evictions != 1 || st.Bytes != 3*int64(len(contents[0])) {
		t.Errorf("Stats = %+v, want 3 blobs after 1 eviction", st)
	}
	// Hits count as use: 0 was the next to go, now 3 is.
	gets := backing.gets.Load()
	mustGet(t, c, keys[0], contents[0])
	mustGet(t, c, keys[2], contents[2])
	if backing.gets.Load() != gets+1 {
		t.Errorf("backing store read %d times, want once (for blob 2)", backing.gets.Load()-gets)
	}
	for i, want := range []bool{true, true, true, false} {
		if got := isCached(t, c, keys[i]); got != want {
			t.Errorf("after a hit and a miss, blob %d cached = %v, want %v", i, got, want)
		}
	}
}

func TestNewCacheRefusesNoRoom(t *testing.T) {
	for _, max := range []int64{0, -1} {
		if _, err := NewCache(newTestLocal(t), t.TempDir(), max, nil); err == nil {
			t.Errorf("NewCache with %d bytes succeeded", max)
		}
	}
}

// Many readers of a few blobs, in a cache too small for them all, some
// stopping early: every full read gets its content, and the directory never
// holds more than the bound. Run it with -race.
func TestCacheConcurrentChurn(t *testing.T) {
	const (
		blobs   = 6
		size    = 20000
		workers = 8
		rounds  = 40
	)
	c, _ := newTestCache(t, 3*size+100)
	contents, keys := putBlobs(t, c, blobs, size)
	var over atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				i := rng.IntN(blobs)
				rc, err := c.Get(t.Context(), keys[i])
				if errors.Is(err, ErrNotFound) {
					continue // between another worker's Delete and Put
				}
				if err != nil {
					t.Error(err)
					return
				}
				if rng.IntN(4) == 0 {
					io.CopyN(io.Discard, rc, int64(rng.IntN(size)))
					rc.Close()
				} else {
					got, err := io.ReadAll(rc)
					rc.Close()
					if errors.Is(err, ErrNotFound) {
						continue // waited for a download, then found it deleted
					}
					if err != nil || !bytes.Equal(got, contents[i]) {
						t.Errorf("blob %d: %d bytes, %v", i, len(got), err)
						return
					}
				}
				if b := c.Stats().Bytes; b > c.max {
					over.Store(b)
				}
				if rng.IntN(20) == 0 {
					if err := c.Delete(t.Context(), keys[i]); err != nil {
						t.Error(err)
						return
					}
					if _, err := c.Put(t.Context(), bytes.NewReader(contents[i])); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if b := over.Load(); b != 0 {
		t.Errorf("the cache held %d bytes, over its %d", b, c.max)
	}
	st := c.Stats()
	if files, total := cacheFiles(t, c); total != st.Bytes || len(files) != st.Blobs || total > c.max {
		t.Errorf("directory holds %d files of %d bytes, Stats = %+v, bound %d", len(files), total, st, c.max)
	}
	t.Logf("%+v", st)
}
