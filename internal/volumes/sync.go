package volumes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/extents"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
	"github.com/sandboxd/sandboxd/internal/store"
)

// A volume's copy in the blob store is "sandboxd-volume-1\n" and its
// image's data extents (package extents), zstd compressed: a sparse image
// of 1 GiB with little written is a small blob, and only the extents are
// read, never the holes. A download is hostile input to this node (the
// blob store is shared by the cluster): the blob is verified against its
// key by the store, and the extents must lie in order inside the image's
// size, which may not pass the volume's.

const syncMagic = "sandboxd-volume-1\n"

// maxWindow bounds the decoder's memory, as the snapshots' does.
const maxWindow = 8 << 20

// upload writes v's image on this node to the blob store and answers its
// key.
func (s *Service) upload(ctx context.Context, v store.Volume) (string, error) {
	f, err := os.Open(s.image(v.ID))
	if err != nil {
		return "", err
	}
	defer f.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeExtents(pw, f)) }()
	info, err := s.cfg.Blobs.Put(ctx, pr)
	pr.CloseWithError(errors.New("upload ended"))
	if err != nil {
		return "", fmt.Errorf("upload: %w", err)
	}
	return info.Key, nil
}

// writeExtents writes image f in the copy's format to w.
func writeExtents(w io.Writer, f *os.File) error {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(maxWindow))
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(zw, 1<<20)
	if _, err := bw.WriteString(syncMagic); err != nil {
		return err
	}
	if err := extents.Write(bw, f); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return zw.Close()
}

// download makes this node's image of v its blob store copy (BlobKey, of
// Generation): written beside, synced, then renamed over the old one.
func (s *Service) download(ctx context.Context, v store.Volume) error {
	rc, err := s.cfg.Blobs.Get(ctx, v.BlobKey)
	if err != nil {
		return fmt.Errorf("download: %w", err)
	}
	defer rc.Close()
	tmp := s.image(v.ID) + ".download"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = readExtents(rc, f, v.SizeBytes)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.image(v.ID))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("download: %w", err)
	}
	return s.writeGeneration(v.ID, v.Generation)
}

// readExtents writes the copy r into f, checking it: the extents in order,
// inside the image's size, which is at most maxSize.
func readExtents(r io.Reader, f *os.File, maxSize int64) error {
	zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(maxWindow*2), zstd.WithDecoderConcurrency(1))
	if err != nil {
		return err
	}
	defer zr.Close()
	br := bufio.NewReaderSize(zr, 1<<20)
	magic := make([]byte, len(syncMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != syncMagic {
		return errors.New("not a volume's copy")
	}
	if _, err := extents.Read(br, f, maxSize); err != nil {
		return fmt.Errorf("the copy: %w", err)
	}
	return nil
}

// copyImage copies image src to dst (which must not exist), sharing its
// blocks where the file system can (a reflink), else reading its data
// extents alone.
func copyImage(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
		return out.Close()
	}
	out.Close()
	if err := host.CopySparse(src, dst, 0o600); err != nil {
		_ = os.Remove(dst)
		return err
	}
	return nil
}
