package blob_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/blob/blobtest"
)

// The benchmarks move blobs of SANDBOXD_BLOB_BENCH_MIB MiB (default 1024,
// the size of a large snapshot layer). Run them with
//
//	go test -run '^$' -bench . -benchtime 3x ./internal/blob
//
// They print MB/s; they never fail on timing.
func benchSize(b *testing.B) int64 {
	mib := int64(1024)
	if v := os.Getenv("SANDBOXD_BLOB_BENCH_MIB"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			b.Fatalf("SANDBOXD_BLOB_BENCH_MIB=%q: want a positive number", v)
		}
		mib = n
	}
	return mib << 20
}

// benchSource writes size pseudo-random bytes to a file once; each use
// reads it behind a distinct 8-byte header, so every Put is new content
// (no deduplication) and producing it costs only a read of a cached file,
// like a snapshot layer written to local disk first.
type benchSource struct {
	f    *os.File
	size int64
}

func newBenchSource(b *testing.B, size int64) *benchSource {
	b.Helper()
	f, err := os.Create(filepath.Join(b.TempDir(), "source"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	if _, err := io.Copy(f, blobtest.Stream(42, size-8)); err != nil {
		b.Fatal(err)
	}
	return &benchSource{f: f, size: size}
}

func (s *benchSource) reader(n uint64) io.Reader {
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], n)
	return io.MultiReader(bytes.NewReader(hdr[:]), io.NewSectionReader(s.f, 0, s.size-8))
}

func benchStores(b *testing.B) []struct {
	name string
	open func(b *testing.B) blob.Store
} {
	return []struct {
		name string
		open func(b *testing.B) blob.Store
	}{
		{"Local", func(b *testing.B) blob.Store {
			s, err := blob.NewLocal(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"S3", func(b *testing.B) blob.Store {
			s, err := blob.Open(b.Context(), blobtest.StartS3(b), b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
}

// BenchmarkPut stores new content each time.
func BenchmarkPut(b *testing.B) {
	size := benchSize(b)
	src := newBenchSource(b, size)
	for _, st := range benchStores(b) {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b)
			b.SetBytes(size)
			var n uint64
			for b.Loop() {
				n++
				info, err := s.Put(b.Context(), src.reader(n))
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := s.Delete(b.Context(), info.Key); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkPutExisting stores content that is already stored: the cost of
// hashing it (and, on S3, spooling it) with nothing to upload.
func BenchmarkPutExisting(b *testing.B) {
	size := benchSize(b)
	src := newBenchSource(b, size)
	for _, st := range benchStores(b) {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b)
			if _, err := s.Put(b.Context(), src.reader(0)); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(size)
			for b.Loop() {
				if _, err := s.Put(b.Context(), src.reader(0)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGet reads a blob to its end, verifying its hash.
func BenchmarkGet(b *testing.B) {
	size := benchSize(b)
	src := newBenchSource(b, size)
	for _, st := range benchStores(b) {
		b.Run(st.name, func(b *testing.B) {
			s := st.open(b)
			info, err := s.Put(b.Context(), src.reader(0))
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 1<<20)
			b.SetBytes(size)
			for b.Loop() {
				rc, err := s.Get(b.Context(), info.Key)
				if err != nil {
					b.Fatal(err)
				}
				// Hide io.Discard's ReadFrom, which would read in small pieces.
				n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, rc, buf)
				rc.Close()
				if err != nil || n != size {
					b.Fatalf("read %d of %d bytes: %v", n, size, err)
				}
			}
		})
	}
}

// BenchmarkS3UploadThenCopy measures the alternative to S3.Put's design,
// for the record: stream content of unknown length to a temporary object
// while hashing it, then copy it server-side to its key and delete the
// temporary. S3.Put (spool to a local file, then upload by parts in
// parallel) was faster on versitygw, and never uploads content already
// stored.
func BenchmarkS3UploadThenCopy(b *testing.B) {
	size := benchSize(b)
	src := newBenchSource(b, size)
	storeURL := blobtest.StartS3(b)
	if _, err := blob.Open(b.Context(), storeURL, b.TempDir()); err != nil { // creates the bucket
		b.Fatal(err)
	}
	raw, _ := dialRaw(b, storeURL)
	const tmp = "blobs/tmp/upload"
	b.SetBytes(size)
	var n uint64
	var upload, cp time.Duration
	for b.Loop() {
		n++
		h := sha256.New()
		t0 := time.Now()
		_, err := raw.client.PutObject(b.Context(), raw.bucket, tmp, io.TeeReader(src.reader(n), h), -1,
			minio.PutObjectOptions{PartSize: 16 << 20})
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		key := "blobs/" + hex.EncodeToString(h.Sum(nil))
		// ComposeObject, unlike CopyObject, copies sources past 5 GiB.
		_, err = raw.client.ComposeObject(b.Context(),
			minio.CopyDestOptions{Bucket: raw.bucket, Object: key},
			minio.CopySrcOptions{Bucket: raw.bucket, Object: tmp})
		if err != nil {
			b.Fatal(err)
		}
		if err := raw.client.RemoveObject(b.Context(), raw.bucket, tmp, minio.RemoveObjectOptions{}); err != nil {
			b.Fatal(err)
		}
		upload += t1.Sub(t0)
		cp += time.Since(t1)
		b.StopTimer()
		if err := raw.client.RemoveObject(b.Context(), raw.bucket, key, minio.RemoveObjectOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(upload.Seconds()/float64(n), "upload-s/op")
	b.ReportMetric(cp.Seconds()/float64(n), "copy-s/op")
}
