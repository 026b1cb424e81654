package snapshot

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
)

// ErrTarTooLarge is returned by ApplyWhole when a layer's uncompressed
// tar is larger than its bound.
var ErrTarTooLarge = errors.New("snapshot: layer's tar exceeds its size limit")

// ApplyWhole applies a layer Write made of a whole directory (a root
// filesystem, not an overlay upper directory) into dir with ApplyTar's
// rules and opts (its whiteout format, privileges and entry bound), after
// checking its manifest, which it returns. At most maxTar bytes of
// uncompressed tar are read (<= 0: unlimited): past them it stops with
// ErrTarTooLarge, nothing more decompressed or written. On error dir
// holds part of the layer.
func ApplyWhole(ctx context.Context, r io.Reader, dir string, maxTar int64, opts TarOptions) (Manifest, TarStats, error) {
	zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(maxWindow*2), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return Manifest{}, TarStats{}, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	defer zr.Close()
	bounded := &BoundedReader{R: zr, Max: maxTar, Err: ErrTarTooLarge}
	tr := tar.NewReader(bounded)
	m, err := readManifest(tr)
	if err == nil {
		var st TarStats
		st, err = applyTar(ctx, tr, dir, opts)
		if err == nil {
			// The end of the stream is read too: bytes after the tar's
			// end would be a blob that is not what Write wrote.
			_, err = io.Copy(io.Discard, bounded)
		}
		if bounded.Over {
			err = fmt.Errorf("%w: more than %d bytes", ErrTarTooLarge, maxTar)
		}
		return m, st, err
	}
	if bounded.Over {
		err = fmt.Errorf("%w: more than %d bytes", ErrTarTooLarge, maxTar)
	}
	return Manifest{}, TarStats{}, err
}

// readManifest reads a layer's first record, its manifest.
func readManifest(tr *tar.Reader) (Manifest, error) {
	hdr, err := tr.Next()
	if err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	mj, ok := hdr.PAXRecords[manifestRecord]
	if hdr.Typeflag != tar.TypeXGlobalHeader || !ok {
		return Manifest{}, fmt.Errorf("%w: no manifest", ErrFormat)
	}
	var m Manifest
	if err := json.Unmarshal([]byte(mj), &m); err != nil {
		return Manifest{}, fmt.Errorf("%w: manifest: %v", ErrFormat, err)
	}
	if m.Version < 1 || m.Version > FormatVersion {
		return Manifest{}, fmt.Errorf("%w: format version %d, want 1 to %d", ErrFormat, m.Version, FormatVersion)
	}
	return m, nil
}

// BoundedReader reads R and fails with Err once more than Max bytes came
// through it (Max <= 0: no bound): the bound holds while reading, so
// nothing past it is decompressed or written. N counts what came through;
// Over says the bound was passed, so that a caller tells the bound from
// the error a reader of the stream made of it (a short tar).
type BoundedReader struct {
	R    io.Reader
	N    int64
	Max  int64
	Err  error
	Over bool
}

func (b *BoundedReader) Read(p []byte) (int, error) {
	if b.Max <= 0 {
		return b.R.Read(p)
	}
	if b.N >= b.Max {
		// One byte more tells a stream of exactly Max from a longer one.
		var one [1]byte
		n, err := b.R.Read(one[:])
		if n > 0 {
			b.Over = true
			return 0, b.Err
		}
		return 0, err
	}
	if int64(len(p)) > b.Max-b.N {
		p = p[:b.Max-b.N]
	}
	n, err := b.R.Read(p)
	b.N += int64(n)
	return n, err
}
