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
	return nil
}
