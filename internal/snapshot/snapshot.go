// Package snapshot owns the filesystem snapshot format that every runtime
// backend produces and consumes: a sandbox's writable layer (its overlayfs
// upper directory) as a zstd-compressed PAX tar.
//
// Format (version 1):
//   - the tar's first record is a PAX global header whose record
//     "SANDBOXD.manifest" holds the JSON Manifest (parent, base image, counts);
//     ordinary tar tools skip it;
//   - then the upper directory's entries in lexical walk order (a directory
//     before its children), with numeric owners, modes, mtimes, symlinks,
//     hard links, FIFOs and device nodes;
//   - overlayfs whiteouts stay what they are on disk, character devices 0:0,
//     and opaque directories carry the xattr trusted.overlay.opaque=y (as a
//     SCHILY.xattr PAX record). user.* and security.capability xattrs are kept;
//     other trusted.overlay.* xattrs (origin, redirect, ...) describe one host's
//     lower filesystem and are dropped.
//
// A layer is content-addressed: its ID is "sha256:" + the hex SHA-256 of the
// compressed bytes, computed while writing. The manifest inside cannot hold its
// own ID; storage keys it by ID.
//
// A layer holds what changed relative to what was below it when it was taken:
// the base image, or the base plus its Parent chain. Restore = Apply each
// layer of the chain into its own empty directory and stack them as overlay
// lower directories (top first) over the base, with a fresh upper; the next
// snapshot then holds only the new changes. Flatten merges a chain into one
// layer so chains stay short. Apply never follows a symlink inside the target
// directory: layers come from sandboxes and are untrusted.
package snapshot

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// FormatVersion is the version of the layer format written by Write.
const FormatVersion = 1

// MediaType names the format for storage and HTTP.
const MediaType = "application/vnd.sandboxd.layer.v1.tar+zstd"

// manifestRecord is the PAX record that carries the manifest.
const manifestRecord = "SANDBOXD.manifest"

// OpaqueXattr marks an overlayfs directory whose lower contents are hidden.
const OpaqueXattr = "trusted.overlay.opaque"

const xattrPrefix = "SCHILY.xattr."

// Manifest describes a layer.
type Manifest struct {
	Version   int       `json:"version"`
	ID        string    `json:"id,omitempty"`     // sha256:<hex> of the blob; not stored inside it
	Parent    string    `json:"parent,omitempty"` // ID of the layer below, "" for the first
	BaseImage string    `json:"base_image,omitempty"`
	Created   time.Time `json:"created"`
	Size      int64     `json:"size,omitempty"` // compressed bytes; not stored inside
	Entries   int       `json:"entries"`        // tar entries, whiteouts included
	Bytes     int64     `json:"bytes"`          // uncompressed file content
	Whiteouts int       `json:"whiteouts"`
}

// ErrFormat is returned for a blob that is not a valid layer.
var ErrFormat = errors.New("not a sandboxd layer")

// Write captures dir, an overlay upper directory, as a layer into w. It
// returns m completed with Version, Created (if zero), the counts, ID and
// Size. dir must not change while it is written (quiesce the sandbox).
func Write(ctx context.Context, w io.Writer, dir string, m Manifest) (Manifest, error) {
	m.Version = FormatVersion
	if m.Created.IsZero() {
		m.Created = time.Now().UTC()
	}
	// Count first so the manifest, which leads the stream, has the totals.
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		if d.Type()&fs.ModeSocket != 0 {
			return nil // sockets cannot be archived and mean nothing once restored
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		return m, fmt.Errorf("walk layer %s: %w", dir, err)
	}
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return m, fmt.Errorf("stat %s: %w", p, err)
		}
		if isWhiteout(&st) {
			m.Whiteouts++
		} else if st.Mode&unix.S_IFMT == unix.S_IFREG {
			m.Bytes += st.Size
		}
	}
	m.Entries = len(paths)

	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(w, h)}
	zw, err := zstd.NewWriter(cw, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return m, fmt.Errorf("start zstd: %w", err)
	}
	tw := tar.NewWriter(zw)
	mj, err := json.Marshal(m)
	if err != nil {
		return m, err
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "sandboxd-layer", PAXRecords: map[string]string{manifestRecord: string(mj)}}); err != nil {
		return m, fmt.Errorf("write manifest: %w", err)
	}
	links := map[[2]uint64]string{}
	buf := make([]byte, 256<<10)
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		rel, _ := filepath.Rel(dir, p)
		if err := writeEntry(tw, p, filepath.ToSlash(rel), links, buf); err != nil {
			return m, fmt.Errorf("archive %s: %w", rel, err)
		}
	}
	if err := tw.Close(); err != nil {
		return m, fmt.Errorf("finish tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return m, fmt.Errorf("finish zstd: %w", err)
	}
	m.ID = "sha256:" + hex.EncodeToString(h.Sum(nil))
	m.Size = cw.n
	return m, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// keepXattr says which extended attributes a layer carries.
func keepXattr(name string) bool {
	return name == OpaqueXattr || strings.HasPrefix(name, "user.") || name == "security.capability"
}

func xattrs(p string) (map[string]string, error) {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	names := make([]byte, sz)
	sz, err = unix.Llistxattr(p, names)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(names[:sz]), "\x00") {
		if name == "" || !keepXattr(name) {
			continue
		}
		vsz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			continue
		}
		v := make([]byte, vsz)
		vsz, err = unix.Lgetxattr(p, name, v)
		if err != nil {
			continue
		}
		out[name] = string(v[:vsz])
	}
	return out, nil
}

func writeEntry(tw *tar.Writer, p, rel string, links map[[2]uint64]string, buf []byte) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	hdr := &tar.Header{
		Name:    rel,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:  tar.FormatPAX,
	}
	xa, err := xattrs(p)
	if err != nil {
		return fmt.Errorf("read xattrs: %w", err)
	}
	if len(xa) > 0 {
		hdr.PAXRecords = map[string]string{}
		for k, v := range xa {
			hdr.PAXRecords[xattrPrefix+k] = v
		}
	}
	var file *os.File
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
		if hdr.Linkname, err = os.Readlink(p); err != nil {
			return err
		}
	case unix.S_IFREG:
		key := [2]uint64{st.Dev, st.Ino}
		if first, ok := links[key]; ok && st.Nlink > 1 {
			hdr.Typeflag = tar.TypeLink
			hdr.Linkname = first
			break
		}
		if st.Nlink > 1 {
			links[key] = rel
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Size = st.Size
		if file, err = os.Open(p); err != nil {
			return err
		}
		defer file.Close()
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor = int64(unix.Major(st.Rdev))
		hdr.Devminor = int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return nil
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if file != nil {
		n, err := io.CopyBuffer(tw, io.LimitReader(file, hdr.Size), buf)
		if err != nil {
			return err
		}
		if n != hdr.Size {
			return fmt.Errorf("file shrank while archiving (%d of %d bytes)", n, hdr.Size)
		}
	}
	return nil
}

// layerReader opens a layer stream and reads its manifest.
type layerReader struct {
	zr *zstd.Decoder
	tr *tar.Reader
	m  Manifest
}

func openLayer(r io.Reader) (*layerReader, error) {
	zr, err := zstd.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	tr := tar.NewReader(zr)
	hdr, err := tr.Next()
	if err != nil {
		zr.Close()
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	mj, ok := hdr.PAXRecords[manifestRecord]
	if hdr.Typeflag != tar.TypeXGlobalHeader || !ok {
		zr.Close()
		return nil, fmt.Errorf("%w: no manifest", ErrFormat)
	}
	var m Manifest
	if err := json.Unmarshal([]byte(mj), &m); err != nil {
		zr.Close()
		return nil, fmt.Errorf("%w: manifest: %v", ErrFormat, err)
	}
	if m.Version != FormatVersion {
		zr.Close()
		return nil, fmt.Errorf("%w: format version %d, want %d", ErrFormat, m.Version, FormatVersion)
	}
	return &layerReader{zr: zr, tr: tr, m: m}, nil
}

// ReadManifest reads the manifest at the start of a layer. ID and Size are
// not part of it: they describe the blob as stored.
func ReadManifest(r io.Reader) (Manifest, error) {
	lr, err := openLayer(r)
	if err != nil {
		return Manifest{}, err
	}
	lr.zr.Close()
	return lr.m, nil
}

// Digest returns the ID of a layer blob: "sha256:" + hex digest.
func Digest(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", n, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

// Apply unpacks the layer r over dir with overlay semantics: a whiteout
// removes what is below it (and stays, to hide the base image), an opaque
// directory drops the contents the directory had before this layer, other
// entries replace what is at their path. Applied to an empty directory this
// restores an upper directory. It returns the layer's manifest.
func Apply(ctx context.Context, r io.Reader, dir string) (Manifest, error) {
	lr, err := openLayer(r)
	if err != nil {
		return Manifest{}, err
	}
	defer lr.zr.Close()
	root, err := filepath.Abs(dir)
	if err != nil {
		return lr.m, err
	}
	type dirTime struct {
		path string
		mt   time.Time
	}
	var dirs []dirTime
	buf := make([]byte, 256<<10)
	for {
		if err := ctx.Err(); err != nil {
			return lr.m, err
		}
		hdr, err := lr.tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return lr.m, fmt.Errorf("%w: %v", ErrFormat, err)
		}
		rel, err := cleanName(hdr.Name)
		if err != nil {
			return lr.m, err
		}
		if rel == "" {
			continue
		}
		p, err := safeParent(root, rel)
		if err != nil {
			return lr.m, err
		}
		if err := applyEntry(root, p, hdr, lr.tr, buf); err != nil {
			return lr.m, fmt.Errorf("apply %s: %w", rel, err)
		}
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirTime{p, hdr.ModTime})
		}
	}
	// Creating children bumps a directory's mtime: restore them last,
	// deepest first.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i].path) > len(dirs[j].path) })
	for _, d := range dirs {
		ts := []unix.Timespec{unix.NsecToTimespec(d.mt.UnixNano()), unix.NsecToTimespec(d.mt.UnixNano())}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, d.path, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return lr.m, nil
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

// safeParent makes sure every parent of rel under root is a real directory
// (creating missing ones) and returns the full path. It refuses a symlink
// anywhere on the way, so an entry can never land outside root.
func safeParent(root, rel string) (string, error) {
	parts := strings.Split(rel, "/")
	cur := root
	for _, part := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, part)
		var st unix.Stat_t
		err := unix.Lstat(cur, &st)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdir(cur, 0o755); err != nil {
				return "", fmt.Errorf("create parent %s: %w", cur, err)
			}
			continue
		}
		if err != nil {
			return "", err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return "", fmt.Errorf("%w: parent of %q is not a directory", ErrFormat, rel)
		}
	}
	return filepath.Join(root, rel), nil
}

func applyEntry(root, p string, hdr *tar.Header, r io.Reader, buf []byte) error {
	var existing unix.Stat_t
	exists := unix.Lstat(p, &existing) == nil
	existingDir := exists && existing.Mode&unix.S_IFMT == unix.S_IFDIR
	if exists && !(hdr.Typeflag == tar.TypeDir && existingDir) {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	mode := uint32(hdr.Mode & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if !existingDir {
			if err := unix.Mkdir(p, 0o700); err != nil {
				return err
			}
		} else if hdr.PAXRecords[xattrPrefix+OpaqueXattr] == "y" {
			// Opaque: what lower layers had here is gone.
			ents, err := os.ReadDir(p)
			if err != nil {
				return err
			}
			for _, e := range ents {
				if err := os.RemoveAll(filepath.Join(p, e.Name())); err != nil {
					return err
				}
			}
		}
	case tar.TypeReg:
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		_, err = io.CopyBuffer(f, r, buf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("%w: bad hard link target %q", ErrFormat, hdr.Linkname)
		}
		tp, err := safeParent(root, target)
		if err != nil {
			return err
		}
		// linkat without AT_SYMLINK_FOLLOW links a symlink itself, never
		// what it points to.
		return unix.Linkat(unix.AT_FDCWD, tp, unix.AT_FDCWD, p, 0)
	case tar.TypeSymlink:
		if err := unix.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := uint32(unix.S_IFCHR)
		switch hdr.Typeflag {
		case tar.TypeBlock:
			kind = unix.S_IFBLK
		case tar.TypeFifo:
			kind = unix.S_IFIFO
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknod(p, kind|mode, int(dev)); err != nil {
			return err
		}
	default:
		return nil // unknown types are skipped, as tar does
	}
	if err := unix.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		// After chown, which clears setuid bits.
		if err := unix.Chmod(p, mode); err != nil {
			return err
		}
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok || !keepXattr(name) {
			continue
		}
		if err := unix.Lsetxattr(p, name, []byte(v), 0); err != nil {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	return nil
}

// Flatten merges a chain of layers, bottom first, into one layer written to
// w, using a scratch directory under tmpDir. base is the root filesystem the
// chain applies to: merging leaves whiteouts that hide nothing in base (a
// file created by one layer and deleted by the next), and overlayfs shows
// those in directory listings as entries that cannot be opened, so they are
// dropped. The result mounted over base shows what the chain mounted over
// base shows; m supplies the result's Parent (usually "") and BaseImage.
func Flatten(ctx context.Context, w io.Writer, layers []io.Reader, base, tmpDir string, m Manifest) (Manifest, error) {
	scratch, err := os.MkdirTemp(tmpDir, "flatten-")
	if err != nil {
		return m, fmt.Errorf("flatten: %w", err)
	}
	defer os.RemoveAll(scratch)
	for i, l := range layers {
		lm, err := Apply(ctx, l, scratch)
		if err != nil {
			return m, fmt.Errorf("flatten: apply layer %d: %w", i, err)
		}
		if m.BaseImage == "" {
			m.BaseImage = lm.BaseImage
		}
	}
	if err := pruneWhiteouts(scratch, base); err != nil {
		return m, fmt.Errorf("flatten: %w", err)
	}
	out, err := Write(ctx, w, scratch, m)
	if err != nil {
		return out, fmt.Errorf("flatten: %w", err)
	}
	return out, nil
}

// pruneWhiteouts removes the whiteouts of upper that hide nothing of base:
// where base has no such path, or where an opaque directory above already
// hides all of base below it.
func pruneWhiteouts(upper, base string) error {
	var walk func(rel string, baseVisible bool) error
	walk = func(rel string, baseVisible bool) error {
		ents, err := os.ReadDir(filepath.Join(upper, rel))
		if err != nil {
			return err
		}
		for _, e := range ents {
			r := filepath.Join(rel, e.Name())
			p := filepath.Join(upper, r)
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				return err
			}
			var bst unix.Stat_t
			inBase := baseVisible && unix.Lstat(filepath.Join(base, r), &bst) == nil
			switch {
			case isWhiteout(&st):
				if !inBase {
					if err := os.Remove(p); err != nil {
						return err
					}
				}
			case st.Mode&unix.S_IFMT == unix.S_IFDIR:
				opaque := false
				if v := make([]byte, 1); true {
					n, err := unix.Lgetxattr(p, OpaqueXattr, v)
					opaque = err == nil && n == 1 && v[0] == 'y'
				}
				below := inBase && bst.Mode&unix.S_IFMT == unix.S_IFDIR && !opaque
				if err := walk(r, below); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk("", true)
}
