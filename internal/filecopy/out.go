package filecopy

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"

	"github.com/dustin/go-humanize"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// Archive is what a copy out of a sandbox will send: every entry under a
// path, walked and measured before anything is sent, so that a copy past
// the limits is refused while its answer can still say so.
type Archive struct {
	fsys  FS
	items []item
	// Bytes is the file content it carries.
	Bytes int64
}

// item is one entry of an Archive: where it is in the sandbox and its
// name in the archive.
type item struct {
	src, name string
	e         Entry
}

// Walk measures the archive of p (Resolve's rules): p itself under its
// base name, and, for a directory, everything below it. Links are kept
// as links, never followed; sockets, pipes and devices are left out.
// The root directory's archive holds its entries without a prefix.
func Walk(ctx context.Context, fsys FS, p string, lim Limits) (*Archive, error) {
	p, err := Resolve(p)
	if err != nil {
		return nil, err
	}
	root, err := fsys.Stat(ctx, p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notFound(p)
	}
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", p, err)
	}
	a := &Archive{fsys: fsys}
	w := walker{a: a, lim: lim, top: p}
	if p == "/" {
		return a, w.dir(ctx, p, "", 0)
	}
	return a, w.add(ctx, p, path.Base(p), root, 0)
}

// walker collects an Archive's items within its limits.
type walker struct {
	a   *Archive
	lim Limits
	top string
}

func (w *walker) add(ctx context.Context, src, name string, e Entry, depth int) error {
	if !e.Mode.IsRegular() && !e.Mode.IsDir() && e.Mode&fs.ModeSymlink == 0 {
		return nil // a socket, pipe or device: nothing a copy can carry
	}
	if len(w.a.items) >= w.lim.Entries {
		return errdefs.Newf(errdefs.ErrTooLarge, "%s holds more than %d files and directories, the most one copy carries; copy less at once", w.top, w.lim.Entries)
	}
	w.a.items = append(w.a.items, item{src: src, name: name, e: e})
	if e.Mode.IsRegular() {
		w.a.Bytes += e.Size
		if w.a.Bytes > w.lim.Bytes {
			return errdefs.Newf(errdefs.ErrTooLarge, "%s holds more than %s, the most one copy carries; copy less at once", w.top, humanize.IBytes(uint64(w.lim.Bytes)))
		}
	}
	if e.Mode.IsDir() {
		return w.dir(ctx, src, name, depth+1)
	}
	return nil
}

func (w *walker) dir(ctx context.Context, src, name string, depth int) error {
	if depth > maxDepth {
		return errdefs.Newf(errdefs.ErrTooLarge, "%s is nested more than %d directories deep", w.top, maxDepth)
	}
	ents, err := w.a.fsys.ListDir(ctx, src)
	if err != nil {
		return fmt.Errorf("list %s: %w", src, err)
	}
	for _, e := range ents {
		if err := w.add(ctx, path.Join(src, e.Name), path.Join(name, e.Name), e, depth); err != nil {
			return err
		}
	}
	return nil
}

// WriteTar sends the archive to w. A file whose content no longer has the
// size it was measured with fails it: its header has already promised
// that many bytes.
func (a *Archive) WriteTar(ctx context.Context, w io.Writer) error {
	tw := tar.NewWriter(w)
	for _, it := range a.items {
		if err := a.writeItem(ctx, tw, it); err != nil {
			return err
		}
	}
	return tw.Close()
}

func (a *Archive) writeItem(ctx context.Context, tw *tar.Writer, it item) error {
	hdr := &tar.Header{Name: it.name, Mode: int64(it.e.Mode.Perm()), ModTime: it.e.ModTime, Format: tar.FormatPAX}
	switch {
	case it.e.Mode.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, it.name+"/"
	case it.e.Mode&fs.ModeSymlink != 0:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, it.e.Link
	default:
		hdr.Typeflag, hdr.Size = tar.TypeReg, it.e.Size
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("archive %s: %w", it.src, err)
	}
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	rc, err := a.fsys.ReadFile(ctx, it.src)
	if err != nil {
		return fmt.Errorf("read %s: %w", it.src, err)
	}
	defer rc.Close()
	n, err := io.CopyN(tw, rc, it.e.Size)
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("read %s: it shrank from %d to %d bytes while it was copied", it.src, it.e.Size, n)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", it.src, err)
	}
	return nil
}
