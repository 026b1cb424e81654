package blob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Store is a content-addressed blob store. Implementations are safe for
// concurrent use.
type Store interface {
	// Put stores the content of r and returns its key and size. The content
	// streams: it is never held in memory whole. Putting content that is
	// already stored stores nothing new and returns the same key.
	Put(ctx context.Context, r io.Reader) (Info, error)

	// PutKnown stores the content of r, which the caller says hashes to key
	// and is size bytes long. Content that does not match both is rejected
	// with an error wrapping ErrMismatch and nothing is stored under key.
	// When key is already stored with that size, r is not read at all.
	PutKnown(ctx context.Context, key string, size int64, r io.Reader) error

	// Get opens the blob stored under key, or fails with ErrNotFound. The
	// reader verifies the content as it goes: reading to the end of a blob
	// whose bytes do not hash to key fails with an error wrapping
	// ErrCorrupt instead of returning io.EOF.
	Get(ctx context.Context, key string) (io.ReadCloser, error)

	// Stat describes the blob stored under key, or fails with ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)

	// Delete removes the blob stored under key. Deleting a blob that is not
	// stored succeeds.
	Delete(ctx context.Context, key string) error

	// List calls fn for every stored blob, in no particular order, and stops
	// at the first error fn returns, returning it. Blobs put or deleted while
	// List runs may or may not be seen.
	List(ctx context.Context, fn func(Info) error) error
}

// Info describes a stored blob.
type Info struct {
	Key  string // lowercase hex SHA-256 of the content
	Size int64  // bytes
	// Modified is when the blob was last written. Garbage collectors use it
	// to spare blobs younger than a grace period, which may be about to be
	// referenced. Local also moves it forward when Put finds the content
	// already stored; S3 does not (it would cost a server-side copy).
	Modified time.Time
}

var (
	// ErrNotFound means no blob is stored under the key.
	ErrNotFound = errors.New("blob not found")
	// ErrInvalidKey means a key is not 64 lowercase hex digits.
	ErrInvalidKey = errors.New("invalid blob key")
	// ErrMismatch means content given to PutKnown does not have the key or
	// the size the caller claimed.
	ErrMismatch = errors.New("blob content does not match its key")
	// ErrCorrupt means a stored blob's content no longer matches its key.
	ErrCorrupt = errors.New("stored blob is corrupt")
)

// KeyLen is the length of a key: a hex SHA-256.
const KeyLen = 2 * sha256.Size

// ValidKey reports whether key has the form of a blob key: 64 lowercase hex
// digits. Only such keys ever reach a file name or an object name.
func ValidKey(key string) bool {
	if len(key) != KeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func checkKey(key string) error {
	if !ValidKey(key) {
		return fmt.Errorf("%w: %q", ErrInvalidKey, truncate(key, 80))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Key returns the key of content: its lowercase hex SHA-256.
func Key(content []byte) string {
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// copyBufSize is the buffer for streaming copies: large enough that per-call
// overhead (syscalls, context checks) is negligible next to hashing, small
// enough that many concurrent Puts cost little memory.
const copyBufSize = 256 << 10

// spoolPrefix starts the names of spool files, so that leftovers can be
// told apart from anything else in a shared temp directory.
const spoolPrefix = "sandboxd-blob-"

// staleTempAge is how old a spool file must be before it is deleted as the
// leftover of a crashed Put. A live Put writes to its file continuously, so
// only files abandoned this long are taken.
const staleTempAge = 24 * time.Hour

// removeStaleSpools deletes spool files in dir last written before before.
func removeStaleSpools(dir string, before time.Time) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), spoolPrefix) {
			continue
		}
		fi, err := e.Info()
		if err != nil || fi.ModTime().After(before) {
			continue // gone already, or maybe still being written
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// spool copies r into a new temporary file in dir while hashing it, and
// with durable set flushes the file to stable storage. On success the
// caller owns the open file (positioned at its end) and must close and
// remove it; on failure nothing is left behind.
func spool(ctx context.Context, dir string, r io.Reader, durable bool) (*os.File, string, int64, error) {
	f, err := os.CreateTemp(dir, spoolPrefix+"*")
	if err != nil {
		return nil, "", 0, fmt.Errorf("create spool file: %w", err)
	}
	fail := func(err error) (*os.File, string, int64, error) {
		f.Close()
		os.Remove(f.Name())
		return nil, "", 0, err
	}
	h := sha256.New()
	buf := make([]byte, copyBufSize)
	size, err := io.CopyBuffer(io.MultiWriter(f, h), ctxReader{ctx, r}, buf)
	if err != nil {
		return fail(fmt.Errorf("write %s: %w", f.Name(), err))
	}
	if durable {
		if err := f.Sync(); err != nil {
			return fail(fmt.Errorf("sync %s: %w", f.Name(), err))
		}
	}
	return f, hex.EncodeToString(h.Sum(nil)), size, nil
}

// ctxReader stops a streaming copy soon after its context is done, so that
// a cancelled Put does not keep reading a large source to the end.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// checkMatch compares what was received with what PutKnown's caller claimed.
func checkMatch(wantKey string, wantSize int64, gotKey string, gotSize int64) error {
	if gotSize != wantSize {
		return fmt.Errorf("%w: %s: got %d bytes, want %d", ErrMismatch, wantKey, gotSize, wantSize)
	}
	if gotKey != wantKey {
		return fmt.Errorf("%w: %s: content hashes to %s", ErrMismatch, wantKey, gotKey)
	}
	return nil
}

// verifyingReader hashes what it reads and, at the end of the content,
// fails with ErrCorrupt unless the content has the expected size and hash.
type verifyingReader struct {
	rc   io.ReadCloser
	key  string
	size int64 // expected size, or -1 when unknown
	h    hash.Hash
	n    int64
	err  error // sticky verdict, once reached
}

func newVerifyingReader(rc io.ReadCloser, key string, size int64) *verifyingReader {
	return &verifyingReader{rc: rc, key: key, size: size, h: sha256.New()}
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	if v.err != nil {
		return 0, v.err
	}
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.size >= 0 && v.n > v.size {
		v.err = fmt.Errorf("%w: %s: longer than its %d bytes", ErrCorrupt, v.key, v.size)
		return n, v.err
	}
	if err == io.EOF {
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.key {
			v.err = fmt.Errorf("%w: %s: %d bytes hash to %s", ErrCorrupt, v.key, v.n, got)
			return n, v.err
		}
		v.err = io.EOF
	} else if err != nil {
		return n, err
	}
	return n, v.err
}

func (v *verifyingReader) Close() error { return v.rc.Close() }
