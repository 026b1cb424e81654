// Package ext4 makes ext4 file system images with mkfs.ext4 (e2fsprogs):
// a sparse file of the disk's size, formatted, optionally filled from a
// directory tree. It is the one place sandboxd formats a disk: the gVisor
// backend's writable layer, the microVM layer disk, the microVM base disk
// of any directory (a custom template's image) and an image's rootfs.ext4.
package ext4

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Options say what the file system gets beyond mkfs.ext4's defaults. Every
// file system is made with no blocks reserved for root (-m 0): no daemon
// runs as root on these disks that would need them.
type Options struct {
	// Mkfs is the mkfs.ext4 binary; empty: looked up in PATH.
	Mkfs string
	// Label is the volume label (-L); empty: none.
	Label string
	// Inodes is the number of inodes (-N); 0: mkfs's default, one per
	// 16 KiB.
	Inodes int64
	// From is a directory tree copied into the file system (-d); empty:
	// the file system starts empty.
	From string
	// RootOwner makes the file system's root directory 0:0 rather than
	// the owner of From (mkfs copies the tree's owner otherwise). It is
	// the root directory's alone: every other file of From keeps its
	// owner, mode (setuid and setgid bits included), hard links and
	// extended attributes, as mkfs -d copies them.
	RootOwner bool
	// NoJournal makes the file system without a journal: for a disk the
	// guest mounts read-only (a base disk), a journal is space for nothing.
	NoJournal bool
	// BlockSize, when not 0, is the block size (-b): 4096 keeps a small
	// file system that may grow on the same block size as a large one.
	BlockSize int
	// RootMode, when not 0, is the root directory's permission bits
	// (unix: 0o1777 is world-writable and sticky, as /tmp), set with
	// debugfs after mkfs, which makes it 0755 whatever From's is.
	RootMode uint32
	// Lazy leaves inode tables and the journal to be initialised by the
	// kernel on first mount and skips discarding the blocks: mkfs then
	// takes tens of milliseconds whatever the size, and a sparse file
	// stays sparse.
	Lazy bool
}

// Create makes a sparse file of size bytes at path, which must not exist
// yet (it is created private to root), and formats it (Format). On error
// the file is removed, so a retry can create it again.
func Create(ctx context.Context, path string, size int64, o Options) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("create disk image: %w", err)
	}
	if err := Format(ctx, path, size, o); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// Format sizes the existing file at path to size bytes, sparse (only the
// blocks mkfs writes take space), and makes an ext4 file system on it.
func Format(ctx context.Context, path string, size int64, o Options) error {
	if err := os.Truncate(path, size); err != nil {
		return fmt.Errorf("size disk image: %w", err)
	}
	mkfs := o.Mkfs
	if mkfs == "" {
		mkfs = "mkfs.ext4"
	}
	args := []string{"-q", "-F", "-t", "ext4", "-m", "0"}
	if o.Label != "" {
		args = append(args, "-L", o.Label)
	}
	if o.Inodes > 0 {
		args = append(args, "-N", strconv.FormatInt(o.Inodes, 10))
	}
	if o.BlockSize > 0 {
		args = append(args, "-b", strconv.Itoa(o.BlockSize))
	}
	if o.NoJournal {
		args = append(args, "-O", "^has_journal")
	}
	var ext []string
	if o.RootOwner {
		ext = append(ext, "root_owner=0:0")
	}
	if o.Lazy {
		ext = append(ext, "lazy_itable_init=1", "lazy_journal_init=1", "nodiscard")
	}
	if len(ext) > 0 {
		args = append(args, "-E", strings.Join(ext, ","))
	}
	if o.From != "" {
		args = append(args, "-d", o.From)
	}
	cmd := exec.CommandContext(ctx, mkfs, append(args, path)...)
	// Its own process group: a terminal's ^C reaches sandboxd, which then
	// ends mkfs through ctx, rather than killing mkfs under it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// mkfs -d of a large tree may be slow to notice the kill; do not wait
	// for its output past this.
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("mkfs.ext4: %w", ctx.Err())
		}
		var notFound *exec.Error
		if errors.As(err, &notFound) {
			return fmt.Errorf("mkfs.ext4 (install e2fsprogs): %w", err)
		}
		return fmt.Errorf("mkfs.ext4 (e2fsprogs): %w: %s", err, strings.TrimSpace(string(out)))
	}
	if o.RootMode != 0 {
		mode := fmt.Sprintf("sif / mode 0%o", syscall.S_IFDIR|o.RootMode&0o7777)
		if out, err := exec.CommandContext(ctx, "debugfs", "-w", "-R", mode, path).CombinedOutput(); err != nil {
			return fmt.Errorf("debugfs (e2fsprogs): set the root directory's mode: %w: %s", err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// GrowImage grows the unmounted ext4 file system in the image at path to
// the image's size, with resize2fs: for an image only the host's kernel
// ever wrote (resize2fs reads the disk in user space, as root). Online
// growth (Grow) needs CAP_SYS_RESOURCE, which a host in a container may
// lack. An image already that size is left as it is.
func GrowImage(ctx context.Context, path string) error {
	cmd := exec.CommandContext(ctx, "resize2fs", "-f", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs (e2fsprogs): %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// resizeFS is EXT4_IOC_RESIZE_FS: _IOW('f', 16, __u64).
const resizeFS = 0x40086610

// Grow grows the mounted ext4 file system at dir to size bytes (its
// device's size, a whole number of its blocks) online, as resize2fs does
// for a mounted one: through the kernel, never by reading the disk in user
// space. A file system already that size is left as it is.
func Grow(dir string, size int64) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("grow file system: %w", err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("grow file system %s: %w", dir, err)
	}
	if st.Bsize <= 0 {
		return fmt.Errorf("grow file system %s: block size %d", dir, st.Bsize)
	}
	blocks := uint64(size / st.Bsize)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), resizeFS, uintptr(unsafe.Pointer(&blocks))); errno != 0 {
		return fmt.Errorf("grow file system %s to %d blocks: %w", dir, blocks, errno)
	}
	return nil
}
