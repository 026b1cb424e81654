package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Local stores blobs in a directory on this node: the blob with key
// "abcdef…" is the file <dir>/ab/cdef…, written once and never modified.
// Content is first written to <dir>/tmp, flushed, and then renamed into
// place, so a crash never leaves a partial file under a valid key; the
// rename is atomic, so concurrent Puts of the same content are safe (the
// last rename wins, with identical bytes).
type Local struct {
	dir string
}

var _ Store = (*Local)(nil)

// NewLocal opens the blob directory dir, creating it if needed, and removes
// temp files that crashed Puts left behind.
func NewLocal(dir string) (*Local, error) {
	l := &Local{dir: dir}
	if err := os.MkdirAll(l.tmpDir(), 0o755); err != nil {
		return nil, fmt.Errorf("open blob directory: %w", err)
	}
	if err := removeStaleSpools(l.tmpDir(), time.Now().Add(-staleTempAge)); err != nil {
		return nil, fmt.Errorf("open blob directory %s: %w", dir, err)
	}
	return l, nil
}

// Dir returns the directory holding the blobs.
func (l *Local) Dir() string { return l.dir }

func (l *Local) tmpDir() string { return filepath.Join(l.dir, "tmp") }

// path returns the file of a valid key.
func (l *Local) path(key string) string {
	return filepath.Join(l.dir, key[:2], key[2:])
}

// Put implements Store.
func (l *Local) Put(ctx context.Context, r io.Reader) (Info, error) {
	f, key, size, err := spool(ctx, l.tmpDir(), r, true)
	if err != nil {
		return Info{}, fmt.Errorf("put blob: %w", err)
	}
	info, err := l.publish(f, key, size)
	if err != nil {
		return Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	return info, nil
}

// PutKnown implements Store.
func (l *Local) PutKnown(ctx context.Context, key string, size int64, r io.Reader) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("put blob: %w", err)
	}
	if info, err := l.Stat(ctx, key); err == nil {
		if info.Size != size {
			return fmt.Errorf("put blob: %w: %s is stored with %d bytes, not %d", ErrMismatch, key, info.Size, size)
		}
		err := l.touch(key)
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		// Deleted since Stat: store it after all.
	} else if !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("put blob: %w", err)
	}
	f, gotKey, gotSize, err := spool(ctx, l.tmpDir(), r, true)
	if err != nil {
		return fmt.Errorf("put blob %s: %w", key, err)
	}
	if err := checkMatch(key, size, gotKey, gotSize); err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("put blob: %w", err)
	}
	if _, err := l.publish(f, key, size); err != nil {
		return fmt.Errorf("put blob %s: %w", key, err)
	}
	return nil
}

// publish moves a flushed temp file to the place of key, or drops it when
// the key is already stored. It always closes and consumes f.
func (l *Local) publish(f *os.File, key string, size int64) (Info, error) {
	tmp := f.Name()
	defer os.Remove(tmp) // no-op once renamed
	// Read-only marks what must never change; it does not stop Delete.
	err := f.Chmod(0o444)
	var written time.Time
	if err == nil {
		var fi os.FileInfo
		if fi, err = f.Stat(); err == nil {
			written = fi.ModTime()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Info{}, err
	}

	dst := l.path(key)
	if fi, err := os.Stat(dst); err == nil && fi.Size() == size {
		now := time.Now()
		err := os.Chtimes(dst, now, now)
		if err == nil {
			return Info{Key: key, Size: size, Modified: now}, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return Info{}, err
		}
		// Deleted since Stat: publish this copy after all.
	}
	// Otherwise the key is not stored, or is stored with the wrong size,
	// which is damage (such content cannot hash to key): the rename
	// replaces it with the good copy.
	shard := filepath.Dir(dst)
	if err := os.Mkdir(shard, 0o755); err == nil {
		if err := syncDir(l.dir); err != nil {
			return Info{}, err
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return Info{}, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return Info{}, err
	}
	// The rename is durable only once the directory entry is.
	if err := syncDir(shard); err != nil {
		return Info{}, err
	}
	// Not stat'ed again: a Delete may already have removed it.
	return Info{Key: key, Size: size, Modified: written}, nil
}

func (l *Local) touch(key string) error {
	now := time.Now()
	if err := os.Chtimes(l.path(key), now, now); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("touch blob %s: %w", key, ErrNotFound)
		}
		return fmt.Errorf("touch blob %s: %w", key, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Get implements Store.
func (l *Local) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("get blob: %w", err)
	}
	f, err := os.Open(l.path(key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("get blob %s: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("get blob %s: %w", key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("get blob %s: %w", key, err)
	}
	return newVerifyingReader(f, key, fi.Size()), nil
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, key string) (Info, error) {
	if err := checkKey(key); err != nil {
		return Info{}, fmt.Errorf("stat blob: %w", err)
	}
	fi, err := os.Stat(l.path(key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Info{}, fmt.Errorf("stat blob %s: %w", key, ErrNotFound)
		}
		return Info{}, fmt.Errorf("stat blob %s: %w", key, err)
	}
	return Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("delete blob: %w", err)
	}
	if err := os.Remove(l.path(key)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete blob %s: %w", key, err)
	}
	return nil
}

// List implements Store. Files that are not blobs (the temp directory,
// anything placed by hand) are skipped.
func (l *Local) List(ctx context.Context, fn func(Info) error) error {
	shards, err := os.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("list blobs: %w", err)
	}
	for _, shard := range shards {
		if !shard.IsDir() || len(shard.Name()) != 2 {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(l.dir, shard.Name()))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("list blobs: %w", err)
		}
		for _, e := range entries {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("list blobs: %w", err)
			}
			key := shard.Name() + e.Name()
			if !e.Type().IsRegular() || !ValidKey(key) {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					continue // deleted since ReadDir
				}
				return fmt.Errorf("list blobs: %w", err)
			}
			if err := fn(Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}); err != nil {
				return err
			}
		}
	}
	return nil
}
