package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/renameio/v2"
	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/ext4"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// baseDisk returns a read-only ext4 image of baseDir for the VM's base disk.
// An image built by internal/image has one beside its rootfs/ (rootfs.ext4);
// any other directory — a template's unpacked OCI image, a test's tree —
// gets one in <state>/bases/<fingerprint>.ext4, built once (concurrent
// creates on the same base wait for one build; other bases do not wait).
// baseImage names the directory's content (Spec.BaseImage): see baseKey.
func (r *Runtime) baseDisk(ctx context.Context, baseDir, baseImage string) (string, error) {
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
	for {
		r.baseMu.Lock()
		if p, ok := r.bases[abs]; ok {
			r.baseMu.Unlock()
			return p, nil
		}
		if b, ok := r.building[abs]; ok {
			r.baseMu.Unlock()
			select {
			case <-b.done:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			// A build ended by its caller's context is tried again
			// by the next caller; any other failure is every caller's.
			if b.err == nil || !errors.Is(b.err, context.Canceled) && !errors.Is(b.err, context.DeadlineExceeded) {
				return b.path, b.err
			}
			continue
		}
		b := &baseBuild{done: make(chan struct{})}
		r.building[abs] = b
		r.baseMu.Unlock()
		b.path, b.err = r.buildBase(ctx, abs, baseImage)
		r.baseMu.Lock()
		delete(r.building, abs)
		if b.err == nil {
			r.bases[abs] = b.path
		}
		r.baseMu.Unlock()
		close(b.done)
		return b.path, b.err
	}
}

// baseBuild is a base disk being made; done is closed when path or err is
// set.
type baseBuild struct {
	done chan struct{}
	path string
	err  error
}

// baseSrcSuffix names the file beside a base disk that records the
// directory it was made of, for pruneBases.
const baseSrcSuffix = ".src"

// buildBase makes (or finds, from an earlier process) the base disk of the
// directory abs. The disk is sized from the tree: what its files, links and
// directories take in 4 KiB blocks, its inode tables, and room for ext4's
// own metadata. It is sparse, has no journal (the guest mounts it
// read-only) and keeps every owner, mode, setuid bit, hard link and
// extended attribute of the tree (only its root directory is made 0:0).
func (r *Runtime) buildBase(ctx context.Context, abs, baseImage string) (string, error) {
	bases := filepath.Join(r.StateDir(), "bases")
	key, addressed := baseKey(abs, baseImage)
	if addressed {
		if p := filepath.Join(bases, key[:24]+".ext4"); exists(p) {
			return p, nil
		}
	}
	tr, err := scanTree(abs)
	if err != nil {
		return "", fmt.Errorf("base %s: %w", abs, err)
	}
	if !addressed {
		key = tr.fingerprint
	}
	path := filepath.Join(bases, key[:24]+".ext4")
	if exists(path) {
		return path, nil
	}
	start := time.Now()
	inodes, size := tr.disk()
	// The disk is sparse: it takes about what the tree's files do. Refuse
	// at once rather than fill the host's disk halfway through mkfs.
	if err := checkFree(bases, tr.blocks*4096+inodes*256); err != nil {
		return "", err
	}
	tmp := path + ".tmp"
	_ = os.Remove(tmp)
	o := ext4.Options{Label: "sandboxd-base", Inodes: inodes, From: abs, RootOwner: true, NoJournal: true, Lazy: true}
	if err := ext4.Create(ctx, tmp, size, o); err != nil {
		return "", fmt.Errorf("base image of %s: %w", abs, err)
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if err := renameio.WriteFile(strings.TrimSuffix(path, ".ext4")+baseSrcSuffix, []byte(abs), 0o600); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", err
	}
	const mib = 1 << 20
	r.log.Info("built base disk", "base", abs, "disk", path, "size_mib", size/mib, "allocated_mib", allocated(path)/mib,
		"entries", tr.entries, "elapsed", time.Since(start).Round(time.Millisecond))
	r.pruneBases(path)
	return path, nil
}

// baseKey names the base disk of the directory abs without reading its
// tree when the directory is content-addressed: an unpacked OCI image in
// the templates cache is named after its manifest's digest
// ("sha256-<hex>") and baseImage says the same ("oci:sha256:<hex>"); such
// a directory is complete when it gets that name and never changes after.
// Anything else is keyed by its tree's fingerprint (scanTree), which walks
// it: seconds for a large image, once per process.
func baseKey(abs, baseImage string) (key string, addressed bool) {
	digest, ok := strings.CutPrefix(baseImage, "oci:")
	hexPart, isSHA := strings.CutPrefix(digest, "sha256:")
	if !ok || !isSHA || len(hexPart) != 64 || filepath.Base(abs) != "sha256-"+hexPart {
		return "", false
	}
	if _, err := hex.DecodeString(hexPart); err != nil {
		return "", false
	}
	sum := sha256.Sum256([]byte("oci " + abs + " " + digest))
	return hex.EncodeToString(sum[:]), true
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// checkFree makes sure the file system holding dir has need bytes free.
func checkFree(dir string, need int64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if free := int64(st.Bavail) * st.Bsize; free < need {
		return errdefs.New(nil, fmt.Sprintf("the server has %d MiB of free disk space, less than the %d MiB the root filesystem's base disk needs; try again later", free>>20, (need+1<<20-1)>>20))
	}
	return nil
}

// pruneBases removes the base disks whose directory is gone (a deleted
// template's image), except keep. A VM that runs on one keeps it: its jail
// holds a hard link (or a bind mount) of the disk, not the name.
func (r *Runtime) pruneBases(keep string) {
	srcs, _ := filepath.Glob(filepath.Join(r.StateDir(), "bases", "*"+baseSrcSuffix))
	for _, src := range srcs {
		disk := strings.TrimSuffix(src, baseSrcSuffix) + ".ext4"
		b, err := os.ReadFile(src)
		if err != nil || disk == keep {
			continue
		}
		if _, err := os.Lstat(string(b)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		r.baseMu.Lock()
		for dir, p := range r.bases {
			if p == disk {
				delete(r.bases, dir)
			}
		}
		r.baseMu.Unlock()
		if err := os.Remove(disk); err != nil && !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("remove an unused base disk", "disk", disk, "err", err)
			continue
		}
		_ = os.Remove(src)
		r.log.Info("removed the base disk of a directory that is gone", "base", string(b), "disk", disk)
	}
}

func dirMtime(dir string) time.Time {
	fi, err := os.Stat(dir)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}

// fingerprint is scanTree's fingerprint of dir.
func fingerprint(dir string) (string, error) {
	tr, err := scanTree(dir)
	return tr.fingerprint, err
}

// tree is what scanTree learns of a directory tree.
type tree struct {
	// fingerprint hashes the tree's path, and its names, types, modes,
	// owners, sizes, mtimes and link targets: what changes when its
	// content changes, without reading every file.
	fingerprint string
	// entries counts every name (a hard link's too); blocks are the
	// 4 KiB blocks its content takes in ext4: each regular file's data
	// once (hard links share it; holes take none), each directory's
	// entries, each symlink too long to live in its inode.
	entries, blocks int64
}

// disk is the inode count and the size in bytes of an ext4 file system
// that holds the tree: its blocks plus an eighth for extent trees and
// block group metadata, its inode tables (256 bytes an inode), and 32 MiB
// of slack, in whole MiB.
func (tr tree) disk() (inodes, size int64) {
	const mib = 1 << 20
	inodes = tr.entries + tr.entries/4 + 4096
	size = tr.blocks*4096 + tr.blocks*4096/8 + inodes*256 + 32*mib
	return inodes, (size + mib - 1) / mib * mib
}

// scanTree walks dir without following links.
func scanTree(dir string) (tree, error) {
	var tr tree
	h := sha256.New()
	fmt.Fprintf(h, "base %s\n", dir)
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	dirBytes := map[string]int64{}
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
		tr.entries++
		if p != dir {
			// A directory entry: 8 bytes and the name, to 4 bytes.
			dirBytes[filepath.Dir(p)] += (8 + int64(len(d.Name())) + 3) &^ 3
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			dirBytes[p] += 0 // an empty directory takes a block too
		case unix.S_IFLNK:
			link, _ = os.Readlink(p)
			if len(link) >= 60 {
				tr.blocks++
			}
		case unix.S_IFREG:
			if st.Nlink > 1 {
				k := inode{uint64(st.Dev), st.Ino}
				if seen[k] {
					break
				}
				seen[k] = true
			}
			// mkfs copies holes as holes: a sparse file takes what it
			// holds, not its length.
			tr.blocks += min((st.Size+4095)/4096, (st.Blocks*512+4095)/4096)
		}
		fmt.Fprintf(h, "%s %o %d:%d %d %d.%d %s\n", rel, st.Mode, st.Uid, st.Gid, st.Size, st.Mtim.Sec, st.Mtim.Nsec, link)
		return nil
	})
	for _, n := range dirBytes {
		tr.blocks += max(1, (n+4095)/4096)
	}
	tr.fingerprint = hex.EncodeToString(h.Sum(nil))
	return tr, err
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
