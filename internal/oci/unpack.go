package oci

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// maxZstdWindow bounds the memory a hostile zstd frame can make the
// decoder allocate (as for sandboxd's own layers).
const maxZstdWindow = 64 << 20

// unpack applies the layers in order into dir.
func (p *pull) unpack(ctx context.Context, dir string) error {
	uncompressed := &snapshot.BoundedReader{Max: p.lim.MaxBytes, Err: errOverLimit}
	for i, l := range p.layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		st, err := p.applyLayer(ctx, i, l.Compressed, dir, uncompressed)
		if err != nil {
			return err
		}
		p.img.Entries += st.Entries
		p.img.SkippedDevices += st.Devices
		p.log.InfoContext(ctx, "oci: layer applied", "ref", p.img.Ref, "layer", i+1, "of", len(p.layers),
			"digest", p.img.Layers[i], "entries", st.Entries, "uncompressed_total", uncompressed.N)
	}
	p.img.Size = uncompressed.N
	return nil
}

// applyLayer reads one layer's blob, at most MaxLayerBytes of it, and
// applies its tar, counting the uncompressed bytes on uncompressed, which
// all layers share.
func (p *pull) applyLayer(ctx context.Context, i int, open func() (io.ReadCloser, error), dir string, uncompressed *snapshot.BoundedReader) (snapshot.TarStats, error) {
	var st snapshot.TarStats
	rc, err := open()
	if err != nil {
		return st, err
	}
	defer rc.Close()
	blob := &snapshot.BoundedReader{R: rc, Max: p.lim.MaxLayerBytes, Err: errOverLimit}
	tr, closeTar, err := decompress(bufio.NewReaderSize(blob, 64<<10))
	if err != nil {
		return st, p.layerErr(i, err, blob, uncompressed)
	}
	defer closeTar()
	uncompressed.R = tr
	entries := p.lim.MaxEntries - p.img.Entries
	if entries <= 0 {
		entries = -1 // none left (0 would be unlimited)
	}
	st, err = snapshot.ApplyTar(ctx, uncompressed, dir, snapshot.TarOptions{
		Whiteouts:  snapshot.OCIWhiteouts,
		KeepSetID:  !p.opts.DropSetID,
		MaxEntries: entries,
	})
	if err != nil {
		return st, p.layerErr(i, err, blob, uncompressed)
	}
	// Read to the end: the blob's digest is checked at its end, so a
	// layer whose bytes are not the ones the manifest names fails here.
	if _, err := io.Copy(io.Discard, uncompressed); err != nil {
		return st, p.layerErr(i, err, blob, uncompressed)
	}
	if _, err := io.Copy(io.Discard, blob); err != nil {
		return st, p.layerErr(i, err, blob, uncompressed)
	}
	return st, nil
}

// layerErr explains a layer's failure, the limits first: a reader past
// its bound makes whatever reads it fail in its own words (a tar format
// error, a short file), and the bound is the reason.
func (p *pull) layerErr(i int, err error, blob, uncompressed *snapshot.BoundedReader) error {
	switch {
	case uncompressed.Over:
		return errdefs.Wrap(errdefs.ErrTooLarge, err, fmt.Sprintf("image %s is larger than the limit of %s uncompressed", p.ref, fetch.FormatSize(p.lim.MaxBytes)))
	case blob.Over:
		return errdefs.Wrap(errdefs.ErrTooLarge, err, layerTooLarge(p.ref, i, p.lim.MaxLayerBytes).Error())
	}
	return fmt.Errorf("layer %d: %w", i+1, err)
}

// errOverLimit is what a bounded reader returns past its bound.
var errOverLimit = errors.New("oci: read past a size limit")

// decompress opens a layer blob by its content, not its media type (which
// registries and builders get wrong): gzip, zstd, or a plain tar.
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, err
	}
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: gzip: %v", snapshot.ErrFormat, err)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderMaxWindow(maxZstdWindow), zstd.WithDecoderMaxMemory(2*maxZstdWindow), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("%w: zstd: %v", snapshot.ErrFormat, err)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}
