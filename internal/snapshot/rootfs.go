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
	bounded := &tarBound{r: zr, max: maxTar}
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
		if bounded.over {
			err = fmt.Errorf("%w: more than %d bytes", ErrTarTooLarge, maxTar)
		}
		return m, st, err
	}
	if bounded.over {
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

// tarBound reads r and fails once more than max bytes (> 0) came through.
type tarBound struct {
	r    io.Reader
	n    int64
	max  int64
	over bool
}

func (b *tarBound) Read(p []byte) (int, error) {
	if b.max <= 0 {
		return b.r.Read(p)
	}
	if b.n >= b.max {
		// One byte more tells a stream of exactly max from a longer one.
		var one [1]byte
		n, err := b.r.Read(one[:])
		if n > 0 {
			b.over = true
			return 0, ErrTarTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > b.max-b.n {
		p = p[:b.max-b.n]
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}
