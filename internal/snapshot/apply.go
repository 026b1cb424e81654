package snapshot

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// resolveFlags make openat2 refuse any path that leaves the target or goes
// through a symlink (or a mount point), instead of following it.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Apply unpacks the layer r over dir with overlay semantics: a whiteout
// removes what is below it (and stays, to hide the base image), an opaque
// directory drops the contents the directory had before this layer, other
// entries replace what is at their path. Applied to an empty directory this
// restores an upper directory. It returns the layer's manifest.
//
// The layer is untrusted. Every operation is relative to a directory file
// descriptor reached from dir without following any symlink, so nothing
// outside dir is ever touched, even through symlinks the layer itself
// creates; device nodes other than whiteouts are skipped; setuid and setgid
// bits (setgid stays on directories, where it only means group
// inheritance) and security.capability are dropped. What the layer stores
// is charged to b (nil: unlimited): past it Apply stops with ErrTooLarge.
func Apply(ctx context.Context, r io.Reader, dir string, b *Budget) (Manifest, error) {
	lr, err := openLayer(r)
	if err != nil {
		return Manifest{}, err
	}
	defer lr.zr.Close()
	_, err = applyTar(ctx, lr.tr, dir, TarOptions{Budget: b})
	return lr.m, err
}

// WhiteoutFormat is how a layer says what it deletes.
type WhiteoutFormat int

const (
	// OverlayWhiteouts are overlayfs's own, as sandboxd's layers carry
	// them: a character device 0:0 is created as is, and a directory with
	// the PAX xattr trusted.overlay.opaque=y drops what it held before.
	OverlayWhiteouts WhiteoutFormat = iota
	// OCIWhiteouts are the OCI image spec's: an entry ".wh.NAME" deletes
	// NAME, and ".wh..wh..opq" deletes what its directory held before this
	// layer. They are carried out, never created: a layer applied this way
	// goes into one directory holding the layers below it, not into an
	// overlay. Device nodes (0:0 included) are skipped and trusted.* xattrs
	// ignored; a leading "./" in names is accepted.
	OCIWhiteouts
)

// TarOptions change how ApplyTar applies a layer.
type TarOptions struct {
	Whiteouts WhiteoutFormat
	// KeepSetID keeps setuid and setgid bits and security.capability, the
	// privileges an image's files may carry (sudo, ping). Only for a
	// target that no unprivileged host user can reach: see package oci.
	KeepSetID bool
	// MaxEntries bounds the layer's entries (0: unlimited; negative:
	// none allowed, for a bound shared with layers before); past it
	// ApplyTar stops with ErrTooManyEntries.
	MaxEntries int
	// Budget is charged what the layer stores (nil: unlimited).
	Budget *Budget
}

// TarStats counts what ApplyTar did.
type TarStats struct {
	Entries   int // entries read, whiteouts included
	Whiteouts int // OCI whiteouts and opaque markers carried out
	Devices   int // device nodes skipped (and hard links to them)
}

// ErrTooManyEntries is returned when a layer has more entries than
// TarOptions.MaxEntries.
var ErrTooManyEntries = errors.New("snapshot: layer has too many entries")

// ApplyTar unpacks r, an uncompressed tar layer, over dir, as Apply does
// for sandboxd's own layers (same guarantees: nothing outside dir is
// touched, no symlink is followed, no device node but an overlay whiteout
// is created), with opts choosing the whiteout format and the policy for
// privileges. On error dir holds part of the layer.
func ApplyTar(ctx context.Context, r io.Reader, dir string, opts TarOptions) (TarStats, error) {
	return applyTar(ctx, tar.NewReader(r), dir, opts)
}

func applyTar(ctx context.Context, tr *tar.Reader, dir string, opts TarOptions) (TarStats, error) {
	var st TarStats
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("open target %s: %w", dir, err)
	}
	defer unix.Close(root)
	a := &applier{root: root, b: opts.Budget, buf: make([]byte, 256<<10), opts: opts, st: &st}
	if opts.Whiteouts == OCIWhiteouts {
		a.unpacked = map[string]bool{}
		a.skipped = map[string]bool{}
	}
	type dirTime struct {
		rel string
		mt  time.Time
	}
	var dirs []dirTime
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, fmt.Errorf("%w: %v", ErrFormat, err)
		}
		rel, err := a.name(hdr.Name)
		if err != nil {
			return st, err
		}
		if rel == "" {
			continue
		}
		if opts.MaxEntries != 0 && st.Entries >= max(opts.MaxEntries, 0) {
			return st, fmt.Errorf("%w: more than %d", ErrTooManyEntries, max(opts.MaxEntries, 0))
		}
		st.Entries++
		if a.unpacked != nil {
			done, err := a.ociWhiteout(rel)
			if err != nil {
				return st, fmt.Errorf("apply %s: %w", rel, err)
			}
			if done {
				continue
			}
		}
		if err := a.entry(rel, hdr, tr); err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
				// The disk under the budget is full first (its file system
				// has overhead): the same refusal, said the same way.
				err = a.b.full(err)
			}
			return st, fmt.Errorf("apply %s: %w", rel, err)
		}
		a.markUnpacked(rel)
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{rel, hdr.ModTime})
		}
	}
	// Creating children bumps a directory's mtime: restore them last. A
	// later entry may have replaced a directory (or a parent of it) with a
	// symlink: resolving without symlinks skips it instead of following.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i].rel) > len(dirs[j].rel) })
	for _, d := range dirs {
		pfd, name, done, err := a.parent(d.rel, false)
		if err != nil {
			continue
		}
		ts := []unix.Timespec{unix.NsecToTimespec(d.mt.UnixNano()), unix.NsecToTimespec(d.mt.UnixNano())}
		_ = unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
		done()
	}
	return st, nil
}

// cleanName validates a tar entry name: relative, no "..", normalized.
func cleanName(name string) (string, error) {
	n := strings.TrimSuffix(name, "/")
	if n == "" || n == "." {
		return "", nil
	}
	if strings.HasPrefix(n, "/") || strings.Contains(n, "\x00") {
		return "", fmt.Errorf("%w: unsafe entry name %q", ErrFormat, name)
	}
	c := filepath.Clean(n)
	if c != n || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: unsafe entry name %q", ErrFormat, name)
	}
	return c, nil
}

// applier unpacks entries under the directory open as root.
type applier struct {
	root int
	b    *Budget
	buf  []byte
	opts TarOptions
	st   *TarStats
	// OCI whiteouts only: the paths this layer put in place (and their
	// parents), which an opaque marker keeps, and the device nodes
	// skipped, so that hard links to them are skipped too.
	unpacked map[string]bool
	skipped  map[string]bool
}

// name validates an entry's name as cleanName does; OCI layers may also
// start names with "./", as tar run in a directory writes them.
func (a *applier) name(n string) (string, error) {
	if a.opts.Whiteouts == OCIWhiteouts {
		for strings.HasPrefix(n, "./") {
			n = n[2:]
		}
	}
	return cleanName(n)
}

// markUnpacked records rel and its parents as put in place by this layer.
func (a *applier) markUnpacked(rel string) {
	if a.unpacked == nil {
		return
	}
	for rel != "." && !a.unpacked[rel] {
		a.unpacked[rel] = true
		rel = path.Dir(rel)
	}
}

const (
	ociWhiteoutPrefix = ".wh."
	ociOpaque         = ".wh..wh..opq"
)

// ociWhiteout carries out rel if it is an OCI whiteout and reports whether
// it was one.
func (a *applier) ociWhiteout(rel string) (bool, error) {
	dir, base := path.Split(rel)
	target, ok := strings.CutPrefix(base, ociWhiteoutPrefix)
	if !ok {
		return false, nil
	}
	a.st.Whiteouts++
	dir = strings.TrimSuffix(dir, "/")
	if base == ociOpaque {
		return true, a.opaque(dir)
	}
	if target == "" || target == "." || target == ".." {
		return true, fmt.Errorf("%w: bad whiteout %q", ErrFormat, rel)
	}
	pfd, name, done, err := a.parent(path.Join(dir, target), false)
	if errors.Is(err, unix.ENOENT) {
		return true, nil // nothing below to delete
	}
	if err != nil {
		return true, err
	}
	defer done()
	return true, a.removeAll(pfd, name)
}

// opaque deletes what dir held before this layer: everything under it
// that this layer did not put there.
func (a *applier) opaque(dir string) error {
	fd := a.root
	if dir != "" {
		var err error
		fd, err = a.beneath(a.root, dir)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		defer unix.Close(fd)
	}
	return a.clearExcept(fd, dir)
}

// clearExcept removes the entries of the directory open as fd (at rel)
// that this layer did not put in place, and recurses into those it did.
func (a *applier) clearExcept(fd int, rel string) error {
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), rel)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		child := path.Join(rel, n)
		if !a.unpacked[child] {
			if err := a.removeAll(fd, n); err != nil {
				return err
			}
			continue
		}
		cfd, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // a file or a symlink of this layer: kept as is
		}
		if err != nil {
			return err
		}
		err = a.clearExcept(cfd, child)
		unix.Close(cfd)
		if err != nil {
			return err
		}
	}
	return nil
}

// beneath opens rel, a directory under root, as an O_PATH descriptor
// without following any symlink on the way.
func (a *applier) beneath(dirfd int, rel string) (int, error) {
	fd, err := unix.Openat2(dirfd, rel, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags})
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
		return -1, fmt.Errorf("%w: %q is not a directory of the layer", ErrFormat, rel)
	}
	return fd, err
}

// parent returns a descriptor of rel's parent directory and rel's last
// component; create makes missing parents. done releases the descriptor.
func (a *applier) parent(rel string, create bool) (fd int, name string, done func(), err error) {
	dir, name := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		return a.root, name, func() {}, nil
	}
	fd, err = a.beneath(a.root, dir)
	if errors.Is(err, unix.ENOENT) && create {
		fd, err = a.mkdirs(dir)
	}
	if err != nil {
		return -1, "", nil, err
	}
	return fd, name, func() { unix.Close(fd) }, nil
}

// mkdirs creates the missing directories of dir, one component at a time.
func (a *applier) mkdirs(dir string) (int, error) {
	cur := a.root
	release := func() {
		if cur != a.root {
			unix.Close(cur)
		}
	}
	for _, part := range strings.Split(dir, "/") {
		err := unix.Mkdirat(cur, part, 0o755)
		if err == nil {
			if err := a.b.charge(entryCost); err != nil {
				release()
				return -1, err
			}
		} else if !errors.Is(err, unix.EEXIST) {
			release()
			return -1, err
		}
		next, err := a.beneath(cur, part)
		release()
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}

// removeAll removes name in dirfd and everything under it, never following
// a symlink, and refunds what it stored.
func (a *applier) removeAll(dirfd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := a.clearDir(dirfd, name); err != nil {
			return err
		}
		if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil {
			return err
		}
	} else if err := unix.Unlinkat(dirfd, name, 0); err != nil {
		return err
	}
	refund := int64(entryCost)
	if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink == 1 {
		refund += storedBytes(&st)
	}
	a.b.refund(refund)
	return nil
}

// clearDir removes the contents of the directory name in dirfd.
func (a *applier) clearDir(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := a.removeAll(fd, n); err != nil {
			return err
		}
	}
	return nil
}

// keepOnApply says which extended attributes Apply sets: file capabilities
// are privileges, and a layer is not trusted to grant them unless opts
// says so; an OCI layer sets no trusted.* xattr (overlay's among them).
func keepOnApply(name string, opts TarOptions) bool {
	if name == "security.capability" {
		return opts.KeepSetID
	}
	if opts.Whiteouts == OCIWhiteouts && strings.HasPrefix(name, "trusted.") {
		return false
	}
	return keepXattr(name)
}

func (a *applier) entry(rel string, hdr *tar.Header, r io.Reader) error {
	pfd, name, done, err := a.parent(rel, true)
	if err != nil {
		return err
	}
	defer done()
	var existing unix.Stat_t
	exists := unix.Fstatat(pfd, name, &existing, unix.AT_SYMLINK_NOFOLLOW) == nil
	existingDir := exists && existing.Mode&unix.S_IFMT == unix.S_IFDIR
	if exists && !(hdr.Typeflag == tar.TypeDir && existingDir) {
		if err := a.removeAll(pfd, name); err != nil {
			return err
		}
	}
	mode := uint32(hdr.Mode & 0o7777)
	switch {
	case a.opts.KeepSetID:
	case hdr.Typeflag == tar.TypeDir:
		mode &^= unix.S_ISUID
	default:
		mode &^= unix.S_ISUID | unix.S_ISGID
	}
	ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	var f *os.File // dirs and regular files: attributes go through it
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !existingDir {
			if err := a.b.charge(entryCost); err != nil {
				return err
			}
			if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
				return err
			}
		} else if a.opts.Whiteouts == OverlayWhiteouts && hdr.PAXRecords[xattrPrefix+OpaqueXattr] == "y" {
			// Opaque: what lower layers had here is gone.
			if err := a.clearDir(pfd, name); err != nil {
				return err
			}
		}
		fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		defer f.Close()
	case tar.TypeReg:
		if err := a.b.charge(entryCost); err != nil {
			return err
		}
		fd, err := unix.Openat(pfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f = os.NewFile(uintptr(fd), name)
		defer f.Close()
		if err := a.content(f, hdr, r); err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := a.name(hdr.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("%w: bad hard link target %q", ErrFormat, hdr.Linkname)
		}
		if a.skipped[target] {
			a.skipped[rel] = true
			a.st.Devices++
			return nil
		}
		tfd, tname, tdone, err := a.parent(target, false)
		if err != nil {
			return err
		}
		defer tdone()
		if err := a.b.charge(entryCost); err != nil {
			return err
		}
		// linkat without AT_SYMLINK_FOLLOW links a symlink itself, never
		// what it points to. The inode's attributes are those its first
		// entry set: a hard link entry changes none.
		return unix.Linkat(tfd, tname, pfd, name, 0)
	case tar.TypeSymlink:
		if err := a.b.charge(entryCost); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, name); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if hdr.Typeflag == tar.TypeBlock || (hdr.Typeflag == tar.TypeChar && a.opts.Whiteouts == OCIWhiteouts) {
			// A device node: never created from an image (see package oci).
			a.st.Devices++
			if a.skipped != nil {
				a.skipped[rel] = true
			}
			return nil
		}
		kind := uint32(unix.S_IFIFO)
		if hdr.Typeflag == tar.TypeChar {
			if hdr.Devmajor != 0 || hdr.Devminor != 0 {
				a.st.Devices++
				return nil // a device node: never created from a layer
			}
			kind = unix.S_IFCHR // the overlay whiteout, 0:0
		}
		if err := a.b.charge(entryCost); err != nil {
			return err
		}
		if err := unix.Mknodat(pfd, name, kind|mode, 0); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		// What is at name is the node just made in a directory reached
		// without symlinks, so following it here cannot leave the target.
		if err := unix.Fchmodat(pfd, name, mode, 0); err != nil {
			return err
		}
		return unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	default:
		return nil // unknown types are skipped
	}
	fd := int(f.Fd())
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	// After chown, which clears setuid bits.
	if err := unix.Fchmod(fd, mode); err != nil {
		return err
	}
	for k, v := range hdr.PAXRecords {
		xname, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok || !keepOnApply(xname, a.opts) {
			continue
		}
		if err := unix.Fsetxattr(fd, xname, []byte(v), 0); err != nil {
			return fmt.Errorf("set xattr %s: %w", xname, err)
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		if err := unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	return nil
}

// content writes a regular file's data into f, keeping holes.
func (a *applier) content(f *os.File, hdr *tar.Header, r io.Reader) error {
	w := &holeWriter{f: f, b: a.b, buf: a.buf}
	size, segs := hdr.Size, []segment{{0, hdr.Size}}
	if rec, ok := hdr.PAXRecords[sparseRecord]; ok {
		var err error
		if size, segs, err = decodeSparse(rec, hdr.Size); err != nil {
			return err
		}
	}
	for _, s := range segs {
		if err := w.copyAt(r, s.off, s.n); err != nil {
			return err
		}
	}
	return w.finish(size)
}
