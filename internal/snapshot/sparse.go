package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sparseRecord is the PAX record of a sparse regular file: "<size>" then
// " <offset> <length>" for each data segment, in order. The entry's tar data
// is the segments' bytes one after the other; everything else is a hole.
// (archive/tar can read GNU sparse files but not write them, and expands
// their holes into zeros when read; a record of our own keeps holes holes
// in both directions.)
const sparseRecord = "SANDBOXD.sparse"

// maxSegments bounds a sparse map so its PAX record stays far below the
// 1 MiB archive/tar accepts; a file with more data segments has its
// smallest holes stored as zeros (which Apply turns back into holes).
const maxSegments = 16384

type segment struct{ off, n int64 }

// dataSegments returns where f (of size bytes) has data, using SEEK_DATA
// and SEEK_HOLE. ok is false when the file has no holes or the file system
// cannot say: then it is stored whole.
func dataSegments(f *os.File, size int64) (segs []segment, ok bool, err error) {
	if size == 0 {
		return nil, false, nil
	}
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole from off to the end
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, false, err
		}
		end = min(end, size)
		if start >= end {
			break
		}
		segs = append(segs, segment{start, end - start})
		off = end
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, false, err
	}
	if len(segs) == 1 && segs[0] == (segment{0, size}) {
		return nil, false, nil
	}
	return coalesce(segs), true, nil
}

// coalesce merges segments across the smallest holes until at most
// maxSegments are left.
func coalesce(segs []segment) []segment {
	for gap := int64(4096); len(segs) > maxSegments; gap *= 2 {
		out := segs[:1]
		for _, s := range segs[1:] {
			last := &out[len(out)-1]
			if s.off-(last.off+last.n) <= gap {
				last.n = s.off + s.n - last.off
				continue
			}
			out = append(out, s)
		}
		segs = out
	}
	return segs
}

func encodeSparse(size int64, segs []segment) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(size, 10))
	for _, s := range segs {
		fmt.Fprintf(&b, " %d %d", s.off, s.n)
	}
	return b.String()
}

// decodeSparse parses a sparse record of an entry whose tar data is
// packed bytes long, refusing maps that overlap, go backwards, run past
// the size or do not account for exactly the packed data.
func decodeSparse(rec string, packed int64) (int64, []segment, error) {
	f := strings.Fields(rec)
	bad := func() (int64, []segment, error) {
		return 0, nil, fmt.Errorf("%w: bad sparse map", ErrFormat)
	}
	if len(f) == 0 || len(f)%2 != 1 || len(f)/2 > maxSegments {
		return bad()
	}
	size, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || size < 0 {
		return bad()
	}
	segs := make([]segment, 0, len(f)/2)
	var pos, total int64
	for i := 1; i < len(f); i += 2 {
		off, err1 := strconv.ParseInt(f[i], 10, 64)
		n, err2 := strconv.ParseInt(f[i+1], 10, 64)
		if err1 != nil || err2 != nil || off < pos || n <= 0 || n > size-off {
			return bad()
		}
		segs = append(segs, segment{off, n})
		pos, total = off+n, total+n
	}
	if total != packed {
		return bad()
	}
	return size, segs, nil
}

// holeWriter writes a file's content at increasing offsets, leaving a hole
// wherever a whole block is zero, and charges what it writes to a Budget.
type holeWriter struct {
	f       *os.File
	b       *Budget
	buf     []byte
	written int64 // bytes charged while writing
}

const holeBlock = 4096

var zeroBlock = make([]byte, holeBlock)

// copyAt copies n bytes of r to the file at off.
func (w *holeWriter) copyAt(r io.Reader, off, n int64) error {
	for n > 0 {
		chunk := w.buf[:min(int64(len(w.buf)), n)]
		if _, err := io.ReadFull(r, chunk); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if err := w.writeData(chunk, off); err != nil {
			return err
		}
		off += int64(len(chunk))
		n -= int64(len(chunk))
	}
	return nil
}

// writeData writes p at off, skipping its all-zero blocks.
func (w *holeWriter) writeData(p []byte, off int64) error {
	for len(p) > 0 {
		// Skip a run of zero blocks.
		z := 0
		for z < len(p) && bytes.Equal(p[z:min(z+holeBlock, len(p))], zeroBlock[:min(holeBlock, len(p)-z)]) {
			z += min(holeBlock, len(p)-z)
		}
		p, off = p[z:], off+int64(z)
		// Then write a run of data blocks at once.
		d := 0
		for d < len(p) && !bytes.Equal(p[d:min(d+holeBlock, len(p))], zeroBlock[:min(holeBlock, len(p)-d)]) {
			d += min(holeBlock, len(p)-d)
		}
		if d == 0 {
			continue
		}
		if err := w.b.charge(int64(d)); err != nil {
			return err
		}
		w.written += int64(d)
		if _, err := w.f.WriteAt(p[:d], off); err != nil {
			return err
		}
		p, off = p[d:], off+int64(d)
	}
	return nil
}

// finish sets the file's size and corrects the charge to the blocks the
// file really got.
func (w *holeWriter) finish(size int64) error {
	if err := w.f.Truncate(size); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(w.f.Fd()), &st); err != nil {
		return err
	}
	stored := storedBytes(&st)
	if stored > w.written {
		return w.b.charge(stored - w.written)
	}
	w.b.refund(w.written - stored)
	return nil
}
