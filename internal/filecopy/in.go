package filecopy

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/dustin/go-humanize"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// Extracted says what a copy into a sandbox wrote.
type Extracted struct {
	Files, Directories int
	Bytes              int64
	// Skipped names the entries not written and why.
	Skipped []string
}

// maxSkipped is how many skipped entries an Extracted names; the rest are
// counted in one last line.
const maxSkipped = 100

// Extract writes the tar archive r into the directory dir (Resolve's
// rules), making dir and the archive's directories. Entries are written
// as they arrive, so a copy refused or cut off midway leaves those before
// it written. An entry whose name leaves dir is refused; links and special
// files are skipped and named in the result.
func Extract(ctx context.Context, fsys FS, dir string, r io.Reader, lim Limits) (Extracted, error) {
	var out Extracted
	dir, err := Resolve(dir)
	if err != nil {
		return out, err
	}
	if err := fsys.MakeDir(ctx, dir); err != nil {
		return out, err
	}
	x := extractor{fsys: fsys, dir: dir, lim: lim, out: &out}
	src := &source{r: r}
	tr := tar.NewReader(src)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			x.closeSkipped()
			return out, nil
		}
		if err != nil {
			return out, errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("the body is not a whole tar archive (after %d entries)", n))
		}
		if n >= lim.Entries {
			return out, errdefs.Newf(errdefs.ErrTooLarge, "the archive holds more than %d entries, the most one copy carries; copy less at once", lim.Entries)
		}
		if err := x.entry(ctx, hdr, tr); err != nil {
			if src.err != nil {
				// The write failed because the body did.
				return out, errdefs.Wrap(errdefs.ErrInvalid, src.err, fmt.Sprintf("the body is not a whole tar archive (it broke off in entry %d, %s)", n+1, hdr.Name))
			}
			return out, err
		}
	}
}

// extractor writes one archive's entries.
type extractor struct {
	fsys    FS
	dir     string
	lim     Limits
	out     *Extracted
	skipped int
}

func (x *extractor) entry(ctx context.Context, hdr *tar.Header, r io.Reader) error {
	name, err := entryName(hdr.Name)
	if err != nil || name == "" {
		return err
	}
	dst := path.Join(x.dir, name)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := x.fsys.MakeDir(ctx, dst); err != nil {
			return err
		}
		x.out.Directories++
	case tar.TypeReg:
		if hdr.Size < 0 || x.out.Bytes+hdr.Size > x.lim.Bytes {
			return errdefs.Newf(errdefs.ErrTooLarge, "the archive holds more than %s, the most one copy carries; copy less at once", humanize.IBytes(uint64(x.lim.Bytes)))
		}
		if err := x.fsys.WriteFile(ctx, dst, r, fs.FileMode(hdr.Mode).Perm()); err != nil {
			return writeError(dst, err)
		}
		x.out.Files++
		x.out.Bytes += hdr.Size
	case tar.TypeSymlink:
		x.skip(fmt.Sprintf("%s: a symbolic link (to %s); links are not copied into a sandbox", name, hdr.Linkname))
	case tar.TypeLink:
		x.skip(fmt.Sprintf("%s: a hard link (to %s); links are not copied into a sandbox", name, hdr.Linkname))
	default:
		x.skip(fmt.Sprintf("%s: not a file or directory (tar type %q)", name, hdr.Typeflag))
	}
	return nil
}

// entryName is an archive entry's name as a clean relative path; "" for
// the archive's root ("./"). A name that could leave the destination (an
// absolute one, or one with a ".." element) is refused: an archive writes
// below its directory only.
func entryName(name string) (string, error) {
	if strings.HasPrefix(name, "/") || slices.Contains(strings.Split(name, "/"), "..") {
		return "", errdefs.Newf(errdefs.ErrInvalid, "archive entry %q would be written outside the destination", name)
	}
	if clean := path.Clean(name); clean != "." {
		return clean, nil
	}
	return "", nil
}

// writeError says why a file could not be written where it is something
// the caller can fix.
func writeError(dst string, err error) error {
	var e *errdefs.Error
	if errors.As(err, &e) {
		return err
	}
	if errors.Is(err, syscall.EISDIR) {
		return errdefs.Wrap(errdefs.ErrInvalid, err, dst+" is a directory: the file cannot replace it")
	}
	return fmt.Errorf("write %s: %w", dst, err)
}

// source is the archive's reader, keeping its first failure apart from
// those of the writes it feeds.
type source struct {
	r   io.Reader
	err error
}

func (s *source) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

// skip names an entry that was not written, up to maxSkipped of them.
func (x *extractor) skip(why string) {
	x.skipped++
	if len(x.out.Skipped) < maxSkipped {
		x.out.Skipped = append(x.out.Skipped, why)
	}
}

// closeSkipped counts the skipped entries beyond those named.
func (x *extractor) closeSkipped() {
	if more := x.skipped - len(x.out.Skipped); more > 0 {
		x.out.Skipped = append(x.out.Skipped, fmt.Sprintf("and %d more entries that are not files or directories", more))
	}
}
