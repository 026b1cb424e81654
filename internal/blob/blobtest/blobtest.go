// Package blobtest holds what tests of blob stores share: the conformance
// suite every blob.Store backend must pass (Run), a real S3-compatible
// server to run it against (StartS3), and deterministic content streams.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob"
)

// Run checks that store behaves as a blob.Store must. The store must be
// empty and used by nothing else while Run runs. The subtests run one after
// another: the streaming subtest measures the process's allocations.
func Run(t *testing.T, store blob.Store) {
	t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, store) })
	t.Run("IdempotentPut", func(t *testing.T) { testIdempotentPut(t, store) })
	t.Run("PutKnown", func(t *testing.T) { testPutKnown(t, store) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, store) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, store) })
	t.Run("List", func(t *testing.T) { testList(t, store) })
	t.Run("FailedPutStoresNothing", func(t *testing.T) { testFailedPut(t, store) })
	t.Run("ConcurrentPutsOfSameContent", func(t *testing.T) { testConcurrentPuts(t, store) })
	t.Run("PutRacingDelete", func(t *testing.T) { testPutRacingDelete(t, store) })
	t.Run("BadKeys", func(t *testing.T) { testBadKeys(t, store) })
	t.Run("Streaming100MiB", func(t *testing.T) { testStreaming(t, store, 100<<20) })
}

// Content returns n bytes of deterministic pseudo-random content, different
// for each seed.
func Content(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8(seedBytes(seed)).Read(b)
	return b
}

// Stream returns a reader of the same n bytes as Content(seed, n) that
// generates them as it goes, so that large blobs cost no memory.
func Stream(seed uint64, n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8(seedBytes(seed)), n)
}

func seedBytes(seed uint64) [32]byte {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	return s
}

// StreamKey returns the key of Stream(seed, n) by hashing it.
func StreamKey(seed uint64, n int64) string {
	h := sha256.New()
	if _, err := io.Copy(h, Stream(seed, n)); err != nil {
		panic(err) // the stream cannot fail
	}
	return hex.EncodeToString(h.Sum(nil))
}

func mustPut(t *testing.T, store blob.Store, content []byte) blob.Info {
	t.Helper()
	info, err := store.Put(t.Context(), bytes.NewReader(content))
	if err != nil {
		t.Fatalf("Put(%d bytes): %v", len(content), err)
	}
	return info
}

func mustRead(t *testing.T, store blob.Store, key string) []byte {
	t.Helper()
	rc, err := store.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return got
}

func listAll(t *testing.T, store blob.Store) map[string]blob.Info {
	t.Helper()
	all := make(map[string]blob.Info)
	err := store.List(t.Context(), func(info blob.Info) error {
		if _, dup := all[info.Key]; dup {
			return fmt.Errorf("key %s listed twice", info.Key)
		}
		all[info.Key] = info
		return nil
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return all
}

func testRoundTrip(t *testing.T, store blob.Store) {
	tests := []struct {
		name string
		size int
	}{
		{"empty", 0},
		{"one byte", 1},
		{"1 MiB", 1 << 20},
		// Past 16 MiB, the S3 backend switches from one PUT to a multipart
		// upload.
		{"17 MiB + 1", 17<<20 + 1},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			content := Content(uint64(100+i), tt.size)
			want := blob.Key(content)
			info := mustPut(t, store, content)
			if info.Key != want || info.Size != int64(tt.size) {
				t.Fatalf("Put = {%s %d}, want {%s %d}", info.Key, info.Size, want, tt.size)
			}
			if info.Modified.IsZero() {
				t.Errorf("Put: Modified is zero")
			}
			if got := mustRead(t, store, want); !bytes.Equal(got, content) {
				t.Fatalf("Get returned %d bytes (key %s), want the %d put", len(got), blob.Key(got), len(content))
			}
			st, err := store.Stat(t.Context(), want)
			if err != nil {
				t.Fatalf("Stat: %v", err)
			}
			if st.Key != want || st.Size != int64(tt.size) || st.Modified.IsZero() {
				t.Fatalf("Stat = %+v, want key %s, size %d, a time", st, want, tt.size)
			}
		})
	}
}

func testIdempotentPut(t *testing.T, store blob.Store) {
	content := Content(200, 300<<10)
	first := mustPut(t, store, content)
	second := mustPut(t, store, content)
	if first.Key != second.Key || first.Size != second.Size {
		t.Fatalf("second Put = %+v, first = %+v", second, first)
	}
	n := 0
	err := store.List(t.Context(), func(info blob.Info) error {
		if info.Key == first.Key {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("List shows the blob %d times, want once", n)
	}
	if got := mustRead(t, store, first.Key); !bytes.Equal(got, content) {
		t.Fatal("content changed by the second Put")
	}
}

// failingReader fails every read: handed to PutKnown for a stored key, it
// proves the content is not read.
type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("read should not happen") }

func testPutKnown(t *testing.T, store blob.Store) {
	ctx := t.Context()
	content := Content(300, 64<<10)
	other := Content(301, 64<<10)
	key := blob.Key(content)
	size := int64(len(content))

	t.Run("wrong hash", func(t *testing.T) {
		wrong := blob.Key(other)
		err := store.PutKnown(ctx, wrong, size, bytes.NewReader(content))
		if !errors.Is(err, blob.ErrMismatch) {
			t.Fatalf("PutKnown with the key of other content: %v, want ErrMismatch", err)
		}
		if _, err := store.Stat(ctx, wrong); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("Stat after rejected PutKnown: %v, want ErrNotFound", err)
		}
	})
	t.Run("wrong size", func(t *testing.T) {
		for _, n := range []int64{size - 1, size + 1, 0} {
			err := store.PutKnown(ctx, key, n, bytes.NewReader(content))
			if !errors.Is(err, blob.ErrMismatch) {
				t.Fatalf("PutKnown claiming %d bytes of %d: %v, want ErrMismatch", n, size, err)
			}
		}
		if _, err := store.Stat(ctx, key); !errors.Is(err, blob.ErrNotFound) {
			t.Fatalf("Stat after rejected PutKnown: %v, want ErrNotFound", err)
		}
	})
	t.Run("right", func(t *testing.T) {
		if err := store.PutKnown(ctx, key, size, bytes.NewReader(content)); err != nil {
			t.Fatalf("PutKnown: %v", err)
		}
		if got := mustRead(t, store, key); !bytes.Equal(got, content) {
			t.Fatal("Get after PutKnown returned other content")
		}
	})
	t.Run("already stored", func(t *testing.T) {
		if err := store.PutKnown(ctx, key, size, failingReader{}); err != nil {
			t.Fatalf("PutKnown of a stored key read its reader: %v", err)
		}
		if err := store.PutKnown(ctx, key, size+1, failingReader{}); !errors.Is(err, blob.ErrMismatch) {
			t.Fatalf("PutKnown of a stored key with another size: %v, want ErrMismatch", err)
		}
	})
}

func testNotFound(t *testing.T, store blob.Store) {
	missing := blob.Key([]byte("never stored"))
	if rc, err := store.Get(t.Context(), missing); !errors.Is(err, blob.ErrNotFound) {
		if err == nil {
			rc.Close()
		}
		t.Errorf("Get(missing): %v, want ErrNotFound", err)
	}
	if _, err := store.Stat(t.Context(), missing); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Stat(missing): %v, want ErrNotFound", err)
	}
}

func testDelete(t *testing.T, store blob.Store) {
	ctx := t.Context()
	keep := mustPut(t, store, Content(400, 1000))
	gone := mustPut(t, store, Content(401, 1000))
	for i := range 2 { // the second delete must succeed too
		if err := store.Delete(ctx, gone.Key); err != nil {
			t.Fatalf("Delete #%d: %v", i+1, err)
		}
	}
	if _, err := store.Stat(ctx, gone.Key); !errors.Is(err, blob.ErrNotFound) {
		t.Fatalf("Stat after Delete: %v, want ErrNotFound", err)
	}
	if rc, err := store.Get(ctx, gone.Key); !errors.Is(err, blob.ErrNotFound) {
		if err == nil {
			rc.Close()
		}
		t.Fatalf("Get after Delete: %v, want ErrNotFound", err)
	}
	if err := store.Delete(ctx, blob.Key([]byte("never stored"))); err != nil {
		t.Fatalf("Delete of a key never stored: %v", err)
	}
	if _, err := store.Stat(ctx, keep.Key); err != nil {
		t.Fatalf("Delete of one blob removed another: %v", err)
	}
	// Content deleted and put again is stored again.
	again := mustPut(t, store, Content(401, 1000))
	if got := mustRead(t, store, again.Key); !bytes.Equal(got, Content(401, 1000)) {
		t.Fatal("content put again after Delete reads back wrong")
	}
}

func testList(t *testing.T, store blob.Store) {
	ctx := t.Context()
	// Start from an empty store, which also exercises deleting everything.
	for key := range listAll(t, store) {
		if err := store.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if all := listAll(t, store); len(all) != 0 {
		t.Fatalf("List after deleting everything: %d blobs", len(all))
	}

	want := make(map[string]int64)
	for i := range 25 {
		content := Content(uint64(500+i), 100*i)
		info := mustPut(t, store, content)
		want[info.Key] = info.Size
	}
	got := listAll(t, store)
	if len(got) != len(want) {
		t.Fatalf("List gave %d blobs, want %d", len(got), len(want))
	}
	for key, size := range want {
		info, ok := got[key]
		if !ok {
			t.Fatalf("List is missing %s", key)
		}
		if info.Size != size || info.Modified.IsZero() {
			t.Fatalf("List gave %+v, want size %d and a time", info, size)
		}
	}

	// An error from fn stops the listing and comes back unchanged.
	stop := errors.New("stop")
	calls := 0
	err := store.List(ctx, func(blob.Info) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 3 {
		t.Fatalf("List with fn failing at the 3rd call: err %v after %d calls", err, calls)
	}
}

// brokenReader yields n bytes of content and then fails, like a snapshot
// producer that dies mid-stream.
type brokenReader struct {
	r io.Reader
}

var errBroken = errors.New("producer died")

func (b *brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, errBroken
	}
	return n, err
}

func testFailedPut(t *testing.T, store blob.Store) {
	before := listAll(t, store)

	_, err := store.Put(t.Context(), &brokenReader{io.LimitReader(Stream(600, 20<<20), 3<<20)})
	if !errors.Is(err, errBroken) {
		t.Fatalf("Put from a failing reader: %v, want its error", err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := store.Put(ctx, Stream(601, 1<<20)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled context: %v, want context.Canceled", err)
	}

	after := listAll(t, store)
	for key := range after {
		if _, ok := before[key]; !ok {
			t.Fatalf("a failed Put left blob %s", key)
		}
	}
}

func testConcurrentPuts(t *testing.T, store blob.Store) {
	const writers = 8
	content := Content(700, 5<<20)
	want := blob.Key(content)
	var wg sync.WaitGroup
	errs := make([]error, writers)
	keys := make([]string, writers)
	for i := range writers {
		wg.Go(func() {
			info, err := store.Put(t.Context(), bytes.NewReader(content))
			errs[i], keys[i] = err, info.Key
		})
	}
	wg.Wait()
	for i := range writers {
		if errs[i] != nil {
			t.Fatalf("Put #%d: %v", i, errs[i])
		}
		if keys[i] != want {
			t.Fatalf("Put #%d = %s, want %s", i, keys[i], want)
		}
	}
	if got := mustRead(t, store, want); !bytes.Equal(got, content) {
		t.Fatal("content put concurrently reads back wrong")
	}
	n := 0
	for key := range listAll(t, store) {
		if key == want {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("List shows the blob %d times, want once", n)
	}
}

// Puts racing Deletes of the same content all succeed, and the content can
// be stored again once the deletes stop. (Whether the blob exists when a
// Put that raced a Delete returns is backend-specific: callers that delete
// must not race their own Puts, which is the garbage collector's problem.)
func testPutRacingDelete(t *testing.T, store blob.Store) {
	content := Content(750, 256<<10)
	key := blob.Key(content)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var deleter sync.WaitGroup
	deleter.Go(func() {
		// Each Delete runs to its end: one cancelled in flight could still
		// be carried out by the server after the Put below.
		for ctx.Err() == nil {
			if err := store.Delete(t.Context(), key); err != nil {
				t.Errorf("Delete: %v", err)
				return
			}
		}
	})
	var putters sync.WaitGroup
	for range 4 {
		putters.Go(func() {
			for range 10 {
				if _, err := store.Put(t.Context(), bytes.NewReader(content)); err != nil {
					t.Errorf("Put racing Delete: %v", err)
					return
				}
				if err := store.PutKnown(t.Context(), key, int64(len(content)), bytes.NewReader(content)); err != nil {
					t.Errorf("PutKnown racing Delete: %v", err)
					return
				}
			}
		})
	}
	putters.Wait()
	cancel()
	deleter.Wait()
	mustPut(t, store, content)
	if got := mustRead(t, store, key); !bytes.Equal(got, content) {
		t.Fatal("content put after the race reads back wrong")
	}
}

func testBadKeys(t *testing.T, store blob.Store) {
	good := blob.Key([]byte("x"))
	bad := []string{
		"",
		"abc",
		good[:63],
		good + "0",
		strings.ToUpper(good),
		"g" + good[1:],
		"../" + good[3:],
		good[:2] + "/" + good[3:],
		"/etc/passwd",
		"../../../../../../../../../../../../../../../../../../../etc/passwd",
		good[:63] + "\x00",
		" " + good[1:],
	}
	ctx := t.Context()
	for _, key := range bad {
		if rc, err := store.Get(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
			if err == nil {
				rc.Close()
			}
			t.Errorf("Get(%q): %v, want ErrInvalidKey", key, err)
		}
		if _, err := store.Stat(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("Stat(%q): %v, want ErrInvalidKey", key, err)
		}
		if err := store.Delete(ctx, key); !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("Delete(%q): %v, want ErrInvalidKey", key, err)
		}
		if err := store.PutKnown(ctx, key, 1, strings.NewReader("x")); !errors.Is(err, blob.ErrInvalidKey) {
			t.Errorf("PutKnown(%q): %v, want ErrInvalidKey", key, err)
		}
	}
	// What was listed is all that is stored: nothing appeared under a
	// mangled name.
	for key := range listAll(t, store) {
		if !blob.ValidKey(key) {
			t.Errorf("List gave invalid key %q", key)
		}
	}
}

// maxStreamAlloc bounds what the process may allocate while putting or
// getting a large blob. Allocation (not live heap) is counted, so the bound
// holds however the garbage collector runs; it is far below the blob sizes
// tested, so holding a blob in memory cannot pass.
const maxStreamAlloc = 32 << 20

func testStreaming(t *testing.T, store blob.Store, size int64) {
	if testing.Short() {
		t.Skip("streams a large blob; skipped in -short mode")
	}
	const seed = 800
	want := StreamKey(seed, size)

	info, putAlloc := allocated(func() (blob.Info, error) {
		return store.Put(t.Context(), Stream(seed, size))
	})
	if info.err != nil {
		t.Fatalf("Put: %v", info.err)
	}
	if info.v.Key != want || info.v.Size != size {
		t.Fatalf("Put = {%s %d}, want {%s %d}", info.v.Key, info.v.Size, want, size)
	}

	got, getAlloc := allocated(func() (string, error) {
		rc, err := store.Get(t.Context(), want)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		h := sha256.New()
		if _, err := io.Copy(h, rc); err != nil {
			return "", err
		}
		return hex.EncodeToString(h.Sum(nil)), nil
	})
	if got.err != nil {
		t.Fatalf("Get: %v", got.err)
	}
	if got.v != want {
		t.Fatalf("Get returned content hashing to %s, want %s", got.v, want)
	}
	t.Logf("%d MiB blob: Put allocated %.1f MiB, Get %.1f MiB", size>>20, mib(putAlloc), mib(getAlloc))
	for _, a := range []struct {
		op string
		n  uint64
	}{{"Put", putAlloc}, {"Get", getAlloc}} {
		if a.n > maxStreamAlloc {
			t.Errorf("%s of a %d MiB blob allocated %.1f MiB, want at most %d MiB: is it buffering the blob?",
				a.op, size>>20, mib(a.n), maxStreamAlloc>>20)
		}
	}
	if err := store.Delete(t.Context(), want); err != nil {
		t.Fatal(err)
	}
}

type result[T any] struct {
	v   T
	err error
}

// allocated runs f and returns its result and how many bytes the process
// allocated meanwhile.
func allocated[T any](f func() (T, error)) (result[T], uint64) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	v, err := f()
	runtime.ReadMemStats(&after)
	return result[T]{v, err}, after.TotalAlloc - before.TotalAlloc
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }
