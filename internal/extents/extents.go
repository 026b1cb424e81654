// Package extents writes files, sparse ones (disk images) above all, as a
// stream of their data extents, and reads such a stream back into files,
// checking it as hostile input: what sandboxd moves through the blob
// store between nodes (a volume's image, a paused sandbox's saved state)
// is read only where the file system has data (SEEK_DATA), never its
// holes, and written back sparse.
//
// A file is its size, then per extent its offset, its length and its
// bytes, then an end mark; a directory is, per regular file in it, its
// relative name before the file, then an empty name. Integers are
// big-endian uint64 (a name's length uint16). PackDir and UnpackDir add a
// magic line and zstd.
package extents

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

const endOfExtents = ^uint64(0)

// Write writes f as its size and data extents to w.
func Write(w io.Writer, f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	var hdr [16]byte
	size := fi.Size()
	binary.BigEndian.PutUint64(hdr[:8], uint64(size))
	if _, err := w.Write(hdr[:8]); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", f.Name(), err)
		}
		hole, err := unix.Seek(int(f.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("read %s: %w", f.Name(), err)
		}
		binary.BigEndian.PutUint64(hdr[:8], uint64(data))
		binary.BigEndian.PutUint64(hdr[8:], uint64(hole-data))
		if _, err := w.Write(hdr[:]); err != nil {
			return err
		}
		if n, err := io.Copy(w, io.NewSectionReader(f, data, hole-data)); err != nil || n != hole-data {
			return fmt.Errorf("read %s: %d of %d bytes: %v", f.Name(), n, hole-data, err)
		}
		off = hole
	}
	binary.BigEndian.PutUint64(hdr[:8], endOfExtents)
	_, err = w.Write(hdr[:8])
	return err
}

// Read writes the file of stream r into f, checking it: the extents in
// order, inside the file's size, which is at most maxSize. It answers the
// size.
func Read(r io.Reader, f *os.File, maxSize int64) (int64, error) {
	var hdr [16]byte
	if _, err := io.ReadFull(r, hdr[:8]); err != nil {
		return 0, fmt.Errorf("the size: %w", err)
	}
	size := binary.BigEndian.Uint64(hdr[:8])
	if size > uint64(maxSize) {
		return 0, fmt.Errorf("a file of %d bytes, more than the %d allowed", size, maxSize)
	}
	if err := f.Truncate(int64(size)); err != nil {
		return 0, err
	}
	var next uint64
	for {
		if _, err := io.ReadFull(r, hdr[:8]); err != nil {
			return 0, fmt.Errorf("cut short: %w", err)
		}
		off := binary.BigEndian.Uint64(hdr[:8])
		if off == endOfExtents {
			return int64(size), nil
		}
		if _, err := io.ReadFull(r, hdr[8:]); err != nil {
			return 0, fmt.Errorf("cut short: %w", err)
		}
		n := binary.BigEndian.Uint64(hdr[8:])
		if off < next || n == 0 || off > size || n > size-off {
			return 0, fmt.Errorf("an extent at %d of %d bytes is out of order or past the size %d", off, n, size)
		}
		if _, err := io.CopyN(io.NewOffsetWriter(f, int64(off)), r, int64(n)); err != nil {
			return 0, fmt.Errorf("cut short: %w", err)
		}
		next = off + n
	}
}

// WriteDir writes every regular file under dir (symbolic links and other
// kinds are refused) to w, each under its name relative to dir.
func WriteDir(w io.Writer, dir string) error {
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", path)
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		var n [2]byte
		binary.BigEndian.PutUint16(n[:], uint16(len(rel)))
		if _, err := w.Write(append(n[:], rel...)); err != nil {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		return Write(w, f)
	})
	if err != nil {
		return err
	}
	_, err = w.Write([]byte{0, 0})
	return err
}

// DirLimits bound what ReadDir writes.
type DirLimits struct {
	Files int   // regular files
	Depth int   // directories a name may have (a/b/c is 2)
	Bytes int64 // their sizes summed (holes included)
}

// ReadDir writes the directory of stream r into dir (made when missing),
// checking it: each name relative, clean, within Depth directories and
// written once, within Files files and Bytes bytes.
func ReadDir(r io.Reader, dir string, lim DirLimits) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	seen := map[string]bool{}
	var total int64
	for {
		var n [2]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return fmt.Errorf("cut short: %w", err)
		}
		l := binary.BigEndian.Uint16(n[:])
		if l == 0 {
			return nil
		}
		b := make([]byte, l)
		if _, err := io.ReadFull(r, b); err != nil {
			return fmt.Errorf("cut short: %w", err)
		}
		name := string(b)
		if !filepath.IsLocal(name) || filepath.Clean(name) != name || strings.Count(name, "/") > lim.Depth || strings.ContainsRune(name, 0) || seen[name] {
			return fmt.Errorf("a file named %q: not a clean relative name within %d directories, or twice", name, lim.Depth)
		}
		if seen[name] = true; len(seen) > lim.Files {
			return fmt.Errorf("more than %d files", lim.Files)
		}
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		size, err := Read(r, f, lim.Bytes-total)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		total += size
	}
}

// packWindow bounds the zstd window of a packed directory, and so a
// decoder's memory.
const packWindow = 8 << 20

// PackDir writes magic, then dir (WriteDir), zstd-compressed, to w.
func PackDir(w io.Writer, dir, magic string) error {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(packWindow))
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(zw, 1<<20)
	if _, err := bw.WriteString(magic); err != nil {
		return err
	}
	if err := WriteDir(bw, dir); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

// UnpackDir reads what PackDir wrote with magic from r into dir (ReadDir,
// within lim).
func UnpackDir(r io.Reader, dir, magic string, lim DirLimits) error {
	zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(packWindow), zstd.WithDecoderMaxMemory(packWindow*2), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return err
	}
	defer zr.Close()
	br := bufio.NewReaderSize(zr, 1<<20)
	got := make([]byte, len(magic))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != magic {
		return fmt.Errorf("not a %q stream", strings.TrimSpace(magic))
	}
	return ReadDir(br, dir, lim)
}
