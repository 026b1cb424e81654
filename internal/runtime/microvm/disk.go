package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/ext4"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// baseDisk returns a read-only ext4 image of baseDir for the VM's base disk.
// An image built by internal/image has one beside its rootfs/ (rootfs.ext4);
// any other directory gets one in <state>/bases/<key>.ext4, keyed by its
// path and a fingerprint of its tree, built once.
func (r *Runtime) baseDisk(ctx context.Context, baseDir string) (string, error) {
	abs, err := filepath.Abs(baseDir)
	if err != nil {
		return "", err
	}
	if filepath.Base(abs) == "rootfs" {
		img := filepath.Join(filepath.Dir(abs), "rootfs.ext4")
		if fi, err := os.Stat(img); err == nil && fi.Mode().IsRegular() && fi.ModTime().After(dirMtime(abs)) {
			return img, nil
		}
	}
	r.baseMu.Lock()
	defer r.baseMu.Unlock()
	if p, ok := r.bases[abs]; ok {
		return p, nil
	}
	fp, err := fingerprint(abs)
	if err != nil {
		return "", fmt.Errorf("base %s: %w", abs, err)
	}
	path := filepath.Join(r.StateDir(), "bases", fp[:24]+".ext4")
	if _, err := os.Stat(path); err == nil {
		r.bases[abs] = path
		return path, nil
	}
	start := time.Now()
	used, files := treeSize(abs)
	const mib = 1 << 20
	size := (used + used/4 + 64*mib + mib - 1) / mib * mib
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	o := ext4.Options{Label: "sandboxd-base", Inodes: files*2 + 4096, From: abs, RootOwner: true, Lazy: true}
	if err := ext4.Create(ctx, tmp, size, o); err != nil {
		return "", fmt.Errorf("base image of %s: %w", abs, err)
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	r.log.Info("built base disk", "base", abs, "disk", path, "size_mib", size/mib, "elapsed", time.Since(start).Round(time.Millisecond))
	r.bases[abs] = path
	return path, nil
}

func dirMtime(dir string) time.Time {
	fi, err := os.Stat(dir)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// fingerprint hashes a tree's names, types, modes, owners, sizes, mtimes
// and link targets: what changes when its content changes, without reading
// every file.
func fingerprint(dir string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "base %s\n", dir)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		link := ""
		if d.Type()&fs.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		}
		fmt.Fprintf(h, "%s %o %d:%d %d %d.%d %s\n", rel, st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Sec, st.Mtim.Nsec, link)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// treeSize is the bytes in regular files and the entry count under dir.
func treeSize(dir string) (bytes, files int64) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		files++
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				bytes += (fi.Size() + 4095) / 4096 * 4096
			}
		}
		return nil
	})
	return bytes, files
}

// layerDisk creates the writable layer disk of Limits.DiskBytes at img:
// the restored layers as lower-0 (bottom) ... lower-N, an empty upper/ and
// work/. The layers are unpacked on the host (snapshot.Apply treats them as
// untrusted) into a staging directory that mkfs copies in. The staging
// directory is on the host's disk, so what the layers unpack to is bounded
// by size (the disk they are for) and the host must have that much free
// first. It returns the restored layers' content addresses, bottom first.
func layerDisk(ctx context.Context, img, staging string, size int64, layers []runtime.Layer) ([]string, error) {
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return nil, err
	}
	if len(layers) > 0 {
		if err := snapshot.CheckFree(staging, size); err != nil {
			return nil, err
		}
	}
	budget := snapshot.NewBudget(size)
	defer os.RemoveAll(staging)
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(staging, d), 0o755); err != nil {
			return nil, err
		}
	}
	var ids []string
	for i, l := range layers {
		dir := filepath.Join(staging, "lower-"+strconv.Itoa(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, err
		}
		id, err := snapshot.ApplyVerified(ctx, l.R, l.ID, dir, budget)
		if err != nil {
			return nil, fmt.Errorf("restore layer %d: %w", i, err)
		}
		ids = append(ids, id)
	}
	// Inodes: one per 16 KiB, as for a general-purpose file system.
	o := ext4.Options{Label: "sandboxd-layer", Inodes: max(size/16384, 4096), From: staging, RootOwner: true, Lazy: true}
	if err := ext4.Create(ctx, img, size, o); err != nil {
		return nil, err
	}
	return ids, nil
}

// allocated is the disk space a sparse image really uses.
func allocated(path string) int64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}
