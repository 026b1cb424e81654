package image

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/renameio/v2"

	"github.com/sandboxd/sandboxd/internal/ext4"
	"github.com/sandboxd/sandboxd/internal/flock"
)

// ext4Name is the file beside rootfs/ holding the same tree as an ext4 file
// system image, for backends that attach the root filesystem as a disk.
const ext4Name = "rootfs.ext4"

// Ext4 returns the path of an ext4 file system image holding the image's
// root filesystem, building it with mkfs.ext4 -d the first time (under the
// image's lock, into a temporary file renamed into place, like the image).
// The file system has room to spare (a third of the content and 128 MiB)
// and inodes for four times the files, as a writable disk would need.
func (img *Image) Ext4(ctx context.Context) (string, error) {
	if img.store == nil {
		return "", fmt.Errorf("ext4 of image %s: image not loaded from a store", img.ID)
	}
	final := filepath.Join(img.dir, ext4Name)
	if _, err := os.Stat(final); err == nil {
		return final, nil
	}
	unlock, err := flock.Lock(ctx, filepath.Join(img.store.dir, img.ID+".lock"), img.store.waiting(img.ID+".lock"))
	if err != nil {
		return "", fmt.Errorf("ext4 of image %s: %w", img.ID, err)
	}
	defer unlock()
	if _, err := os.Stat(final); err == nil {
		return final, nil
	}
	// A crash while the lock was last held may have left a temporary file
	// (renameio's ".rootfs.ext4<digits>", or an older ".rootfs.ext4-*").
	if olds, _ := filepath.Glob(filepath.Join(img.dir, "."+ext4Name+"*")); len(olds) > 0 {
		for _, o := range olds {
			_ = os.Remove(o)
		}
	}
	mkfs, err := lookTool("mkfs.ext4")
	if err != nil {
		return "", fmt.Errorf("ext4 of image %s: %w", img.ID, err)
	}
	used, files, err := diskUsage(img.Rootfs)
	if err != nil {
		return "", fmt.Errorf("ext4 of image %s: %w", img.ID, err)
	}
	const mib = 1 << 20
	size := (used + used/3 + 128*mib + mib - 1) / mib * mib
	inodes := files*4 + 16384

	// Built in a pending file beside final and renamed into place once
	// synced, so final is always a whole file system. 0644: a VMM not
	// running as root must be able to read it.
	pf, err := renameio.NewPendingFile(final, renameio.WithTempDir(img.dir), renameio.WithStaticPermissions(0o644))
	if err != nil {
		return "", fmt.Errorf("ext4 of image %s: %w", img.ID, err)
	}
	defer func() { _ = pf.Cleanup() }() // a no-op once it replaced final
	start := time.Now()
	o := ext4.Options{Mkfs: mkfs, Label: "sandboxd-root", Inodes: inodes, From: img.Rootfs, RootOwner: true}
	if err := ext4.Format(ctx, pf.Name(), size, o); err != nil {
		return "", fmt.Errorf("ext4 of image %s: %w", img.ID, err)
	}
	// Syncing the pending file's descriptor flushes what mkfs wrote: fsync
	// works on the file, not on the descriptor that wrote it.
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return "", fmt.Errorf("ext4 of image %s: %w", img.ID, err)
	}
	if err := fsyncDir(img.dir); err != nil {
		return "", fmt.Errorf("ext4 of image %s: %w", img.ID, err)
	}
	img.store.logger.Info("built ext4 image", "image", img.ID, "size_mib", size/mib, "elapsed", time.Since(start).Round(time.Millisecond))
	return final, nil
}
