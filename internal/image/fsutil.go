package image

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
)

// removeTree deletes dir and everything below it, but first makes sure that
// nothing is mounted inside it: a bind mount of the host's /dev left behind
// by a crashed build would otherwise have its device nodes deleted. Mounts
// found are detached; if any remain, removeTree refuses.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	mounts, err := mountinfo.Under(abs)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	// Deepest first, so no mount hides another.
	for i := len(mounts) - 1; i >= 0; i-- {
		_ = unix.Unmount(mounts[i], unix.MNT_DETACH)
	}
	if len(mounts) > 0 {
		if left, err := mountinfo.Under(abs); err != nil || len(left) > 0 {
			return fmt.Errorf("remove %s: still has mounts %v (%v)", dir, left, err)
		}
	}
	if err := os.RemoveAll(abs); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// diskUsage returns the bytes dir occupies on disk (allocated blocks, each
// hard-linked file counted once) and the number of inodes it holds.
func diskUsage(dir string) (bytes int64, inodes int64, err error) {
	seen := map[[2]uint64]bool{}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			bytes += info.Size()
			inodes++
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			id := [2]uint64{uint64(st.Dev), st.Ino}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		bytes += st.Blocks * 512
		inodes++
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("measure %s: %w", dir, err)
	}
	return bytes, inodes, nil
}

// syncDir flushes the file system holding dir, so that what a rename is
// about to publish is on disk before the rename is.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// fsyncDir makes a rename inside dir durable.
func fsyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
