package image

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
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
	mounts, err := mountsUnder(abs)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	// Deepest first, so no mount hides another.
	for i := len(mounts) - 1; i >= 0; i-- {
		_ = unix.Unmount(mounts[i], unix.MNT_DETACH)
	}
	if len(mounts) > 0 {
		if left, err := mountsUnder(abs); err != nil || len(left) > 0 {
			return fmt.Errorf("remove %s: still has mounts %v (%v)", dir, left, err)
		}
	}
	if err := os.RemoveAll(abs); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// mountsUnder lists the mount points at or below dir, in mount order.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// Field 5 is the mount point, with spaces and the like escaped
		// as octal (\040).
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
