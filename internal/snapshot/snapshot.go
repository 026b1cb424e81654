// Package snapshot owns the filesystem snapshot format that every runtime
// backend produces and consumes: a sandbox's writable layer (its overlayfs
// upper directory) as a zstd-compressed PAX tar.
//
// Format (version 2; version 1 is version 2 without sparse files):
//   - the tar's first record is a PAX global header whose record
//     "SANDBOXD.manifest" holds the JSON Manifest (parent, base image, counts);
//     ordinary tar tools skip it;
//   - then the upper directory's entries in lexical walk order (a directory
//     before its children), with numeric owners, modes, mtimes, symlinks,
//     hard links, FIFOs and device nodes;
//   - a regular file with holes carries the PAX record SANDBOXD.sparse
//     ("<size> <offset> <length> ...", its data segments) and as tar data
//     only those segments' bytes, so a sparse file costs what it stores,
//     not its apparent size;
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
// layer so chains stay short.
//
// Layers come from sandboxes and are untrusted. Apply works relative to
// the target's file descriptor and never resolves a symlink (openat2 with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), creates no device node but the
// overlay whiteout (character device 0:0), drops setuid and setgid bits and
// file capabilities, and writes zero blocks as holes. Every capture, apply
// and flatten can be bounded by a Budget (the sandbox's disk limit).
//
// ApplyTar is the same applier for plain tar layers that are not
// sandboxd's own: OCI image layers (package oci) with OCI whiteouts
// (".wh.NAME", ".wh..wh..opq"), which are carried out rather than created,
// device nodes all skipped, an entry bound, and a choice to keep setuid,
// setgid and file capabilities for a target no other host user can reach.
// ApplyWhole applies a layer Write made of a whole root filesystem (package
// templates stores images that way) with ApplyTar's rules and a bound on
// its uncompressed tar.
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
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// FormatVersion is the version of the layer format written by Write.
// Readers accept versions 1 and 2.
const FormatVersion = 2

// maxWindow bounds the memory a hostile zstd frame can make the decoder
// allocate; Write's encoder uses an 8 MiB window.
const maxWindow = 64 << 20

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
// Size. dir must not change while it is written (quiesce the sandbox). The
// layer's data (holes excluded) and entries are charged to b (nil:
// unlimited) before anything is written, so a layer past it is refused
// with ErrTooLarge at once.
func Write(ctx context.Context, w io.Writer, dir string, m Manifest, b *Budget) (Manifest, error) {
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
		cost := int64(entryCost)
		if isWhiteout(&st) {
			m.Whiteouts++
		} else if st.Mode&unix.S_IFMT == unix.S_IFREG {
			m.Bytes += st.Size
			cost += storedBytes(&st)
		}
		if err := b.charge(cost); err != nil {
			return m, err
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
	var segs []segment
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
		if file, err = os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0); err != nil {
			return err
		}
		defer file.Close()
		sparse := false
		if segs, sparse, err = dataSegments(file, st.Size); err != nil {
			return err
		} else if sparse {
			if hdr.PAXRecords == nil {
				hdr.PAXRecords = map[string]string{}
			}
			hdr.PAXRecords[sparseRecord] = encodeSparse(st.Size, segs)
			hdr.Size = 0
			for _, s := range segs {
				hdr.Size += s.n
			}
		} else {
			segs = []segment{{0, st.Size}}
		}
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
	for _, s := range segs {
		n, err := io.CopyBuffer(tw, io.NewSectionReader(file, s.off, s.n), buf)
		if err != nil {
			return err
		}
		if n != s.n {
			return fmt.Errorf("file shrank while archiving (%d of %d bytes at %d)", n, s.n, s.off)
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
	zr, err := zstd.NewReader(r, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderMaxMemory(maxWindow*2), zstd.WithDecoderConcurrency(1))
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
	if m.Version < 1 || m.Version > FormatVersion {
		zr.Close()
		return nil, fmt.Errorf("%w: format version %d, want 1 to %d", ErrFormat, m.Version, FormatVersion)
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

// Flatten merges a chain of layers, bottom first, into one layer written to
// w, using a scratch directory under tmpDir. base is the root filesystem the
// chain applies to: merging leaves whiteouts that hide nothing in base (a
// file created by one layer and deleted by the next), and overlayfs shows
// those in directory listings as entries that cannot be opened, so they are
// dropped. The result mounted over base shows what the chain mounted over
// base shows; m supplies the result's Parent (usually "") and BaseImage.
//
// The scratch directory's contents are charged to a Budget of limit bytes
// (the sandbox's disk limit; <= 0 unlimited), and the file system of tmpDir
// must have that much free first: a chain cannot make the host hold more
// than one sandbox's disk for it. The result's capture is bounded the same.
func Flatten(ctx context.Context, w io.Writer, layers []io.Reader, base, tmpDir string, m Manifest, limit int64) (Manifest, error) {
	if err := CheckFree(tmpDir, limit); err != nil {
		return m, fmt.Errorf("flatten: %w", err)
	}
	scratch, err := os.MkdirTemp(tmpDir, "flatten-")
	if err != nil {
		return m, fmt.Errorf("flatten: %w", err)
	}
	defer os.RemoveAll(scratch)
	b := NewBudget(limit)
	for i, l := range layers {
		lm, err := Apply(ctx, l, scratch, b)
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
	out, err := Write(ctx, w, scratch, m, NewBudget(limit))
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
