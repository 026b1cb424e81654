package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/ext4"
	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// makeDisk creates a sparse ext4 image of size bytes at img and mounts it at
// dir through an auto-clearing loop device (the device goes with the mount).
// mkfs of a sparse image with lazy init takes ≈ 45 ms whatever the size.
func makeDisk(ctx context.Context, img, dir string, size int64) error {
	if err := ext4.Create(ctx, img, size, ext4.Options{Lazy: true}); err != nil {
		return err
	}
	return mountDisk(ctx, img, dir)
}

// mountDisk mounts the ext4 image img at dir through an auto-clearing loop
// device.
func mountDisk(ctx context.Context, img, dir string) error {
	mnt := exec.CommandContext(ctx, "mount", "-o", "loop,nosuid,nodev", img, dir)
	if out, err := mnt.CombinedOutput(); err != nil {
		return fmt.Errorf("mount disk image: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// volumeDir is where the sandbox's volume i is mounted on the host.
func (s *sandbox) volumeDir(i int) string { return s.Path("volumes", strconv.Itoa(i)) }

// mountVolumes mounts the sandbox's volume images on the host, each
// through its own auto-clearing loop device, nosuid and nodev (read-only
// when asked); buildSpec binds them into the sandbox. A read-write one is
// grown to its image's size first (it may have been made larger since).
// Only images the host's kernel alone wrote get here: package volumes
// refuses a gVisor sandbox a volume a microVM had read-write.
func (s *sandbox) mountVolumes(ctx context.Context, vs []runtime.VolumeMount) error {
	for i, v := range vs {
		dir := s.volumeDir(i)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		opts := "loop,nosuid,nodev"
		if v.ReadOnly {
			opts += ",ro"
		} else if err := ext4.GrowImage(ctx, v.Image); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		if out, err := exec.CommandContext(ctx, "mount", "-o", opts, v.Image, dir).CombinedOutput(); err != nil {
			return fmt.Errorf("mount the volume for %s: %w: %s", v.Path, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// unmountVolumes unmounts what mountVolumes mounted for vs.
func (s *sandbox) unmountVolumes(vs []runtime.VolumeMount) error {
	var errs []error
	for i := range vs {
		if err := unmount(s.volumeDir(i)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountOverlay mounts base, the restored lowers (bottom first) and upper at
// target. index, redirect_dir and metacopy stay off so the upper directory
// is self-contained: it alone is the snapshot.
func mountOverlay(target, base string, lowers []string, upper, work string) error {
	stack := make([]string, 0, len(lowers)+1)
	for i := len(lowers) - 1; i >= 0; i-- {
		stack = append(stack, lowers[i])
	}
	stack = append(stack, base)
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,index=off,redirect_dir=off,metacopy=off",
		strings.Join(stack, ":"), upper, work)
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay rootfs: %w", err)
	}
	return nil
}

// unmount unmounts target if it is a mount point, retrying while it is busy
// (the gofer may take a moment to exit), and detaching it lazily as a last
// resort so Destroy always completes.
func unmount(target string) error {
	deadline := time.Now().Add(3 * time.Second)
	for {
		if !mountinfo.IsMountPoint(target) {
			return nil
		}
		err := unix.Unmount(target, 0)
		if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			continue
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			if derr := unix.Unmount(target, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
				return fmt.Errorf("unmount %s: %w", target, err)
			}
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// diskUsage is the bytes in use on the file system holding dir.
func diskUsage(dir string) int64 {
	var st unix.Statfs_t
	if unix.Statfs(dir, &st) != nil {
		return 0
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// allocatedBytes is the space a (sparse) file holds on its filesystem.
func allocatedBytes(path string) int64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// dirSize sums the sizes of the files under dir (no disk limit: no image).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
