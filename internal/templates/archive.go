package templates

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// An uploaded archive is read on the host only as a stream, never
// unpacked there: checkArchive refuses what no COPY may write (an entry
// outside the archive, a link that leaves it, a device) and bounds it,
// and the build writes the entries it copies through the build
// sandbox's agent (copy.go), which resolves every path inside the
// sandbox.

// archiveLimits bound one archive's content.
type archiveLimits struct {
	Bytes   int64 // file content, all entries together
	Entries int
}

// archiveStats count what an archive holds.
type archiveStats struct {
	Entries int
	Bytes   int64
}

// archiveEntry is a checked entry.
type archiveEntry struct {
	// Name is clean and relative ("a/b"), never "" or ".".
	Name string
	Type byte // tar.TypeReg, tar.TypeDir, tar.TypeSymlink or tar.TypeLink
	Mode int64
	Size int64
	// Link is a symlink's target as written (relative, staying inside
	// the archive), or a hard link's target entry (a clean name).
	Link string
}

// maxNameBytes bounds an entry's name and link target.
const maxNameBytes = 4096

// compressions are the magic numbers of compressions an upload may not
// use (gzip is read).
var compressions = []struct {
	magic []byte
	name  string
}{
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, "zstd"},
	{[]byte("BZh"), "bzip2"},
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0}, "xz"},
	{[]byte("PK\x03\x04"), "zip"},
}

// checkArchive reads r, a tar or a gzip of one (told by its first bytes),
// and checks every entry: its name stays inside the archive (relative, no
// ".."), it is a regular file, a directory, a symbolic link whose target
// is relative and stays inside the archive, or a hard link to an earlier
// regular file; the whole holds at most lim's entries and bytes. fn, when
// not nil, gets each checked entry with its content, in order; its error
// ends the read. Errors are ErrInvalid or ErrTooLarge with a reason for
// the uploader, naming the entry.
func checkArchive(r io.Reader, lim archiveLimits, fn func(archiveEntry, io.Reader) error) (archiveStats, error) {
	var st archiveStats
	br := bufio.NewReader(r)
	head, err := br.Peek(6)
	if len(head) == 0 {
		if err == io.EOF {
			return st, errdefs.New(errdefs.ErrInvalid, "the archive is empty: upload a tar archive (or a gzipped one)")
		}
		return st, err
	}
	var in io.Reader = br
	if bytes.HasPrefix(head, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return st, errdefs.Wrap(errdefs.ErrInvalid, err, "the archive starts as gzip but is not a valid gzip stream")
		}
		defer zr.Close()
		in = zr
	} else {
		for _, c := range compressions {
			if bytes.HasPrefix(head, c.magic) {
				return st, errdefs.Newf(errdefs.ErrInvalid, "the archive is %s: upload a tar archive, or a gzipped one", c.name)
			}
		}
	}
	// Headers, padding and PAX records cost a few blocks an entry; past
	// that, the stream is a bomb however its headers add up.
	unpacked := &capReader{r: in, left: lim.Bytes + int64(lim.Entries)*2048 + 8<<20}
	tr := tar.NewReader(unpacked)
	seen := map[string]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return st, nil
		}
		if err != nil {
			if unpacked.over {
				return st, errdefs.Newf(errdefs.ErrTooLarge, "the archive unpacks to more than %s", humanize.IBytes(uint64(unpacked.limit())))
			}
			var e *errdefs.Error
			if errors.As(err, &e) {
				return st, err
			}
			return st, errdefs.Wrap(errdefs.ErrInvalid, err, fmt.Sprintf("the archive is not a whole tar archive (after %d entries)", st.Entries))
		}
		st.Entries++
		if st.Entries > lim.Entries {
			return st, errdefs.Newf(errdefs.ErrTooLarge, "the archive holds more than %d entries", lim.Entries)
		}
		e, err := checkEntry(hdr, seen)
		if err != nil {
			return st, err
		}
		if e.Name == "" {
			continue // the archive's root, "./"
		}
		if e.Type == tar.TypeReg {
			if st.Bytes+e.Size > lim.Bytes {
				return st, errdefs.Newf(errdefs.ErrTooLarge, "the archive holds more than %s of files", humanize.IBytes(uint64(lim.Bytes)))
			}
			st.Bytes += e.Size
		}
		seen[e.Name] = e.Type
		if fn != nil {
			if err := fn(e, tr); err != nil {
				return st, err
			}
		}
	}
}

// checkEntry checks one header (checkArchive's rules); seen holds the
// entries before it, by name. The archive's root comes back with Name "".
func checkEntry(hdr *tar.Header, seen map[string]byte) (archiveEntry, error) {
	shown := hdr.Name
	if len(shown) > 200 {
		shown = shown[:200] + "…"
	}
	bad := func(format string, a ...any) error {
		return errdefs.Newf(errdefs.ErrInvalid, "archive entry %q: "+format, append([]any{shown}, a...)...)
	}
	if len(hdr.Name) > maxNameBytes || len(hdr.Linkname) > maxNameBytes {
		return archiveEntry{}, bad("its name or link is longer than %d bytes", maxNameBytes)
	}
	if strings.ContainsRune(hdr.Name, 0) || strings.ContainsRune(hdr.Linkname, 0) {
		return archiveEntry{}, bad("its name or link contains NUL")
	}
	name, err := relName(hdr.Name)
	if err != nil {
		return archiveEntry{}, bad("%v (path traversal is refused)", err)
	}
	e := archiveEntry{Name: name, Mode: hdr.Mode & 0o7777, Size: hdr.Size}
	switch hdr.Typeflag {
	case tar.TypeReg: // the reader reads the old TypeRegA as TypeReg
		if hdr.Size < 0 {
			return archiveEntry{}, bad("a negative size")
		}
		e.Type = tar.TypeReg
	case tar.TypeDir:
		e.Type, e.Size = tar.TypeDir, 0
	case tar.TypeSymlink:
		t := hdr.Linkname
		switch {
		case t == "":
			return archiveEntry{}, bad("a symbolic link to nothing")
		case path.IsAbs(t):
			return archiveEntry{}, bad("a symbolic link to the absolute path %q; links must stay inside the copied files", t)
		}
		if _, err := relName(path.Join(path.Dir(name), t)); err != nil {
			return archiveEntry{}, bad("a symbolic link to %q, outside the copied files", t)
		}
		e.Type, e.Size, e.Link = tar.TypeSymlink, 0, t
	case tar.TypeLink:
		t, err := relName(hdr.Linkname)
		if err != nil || t == "" {
			return archiveEntry{}, bad("a hard link to %q, outside the copied files", hdr.Linkname)
		}
		if seen[t] != tar.TypeReg {
			return archiveEntry{}, bad("a hard link to %q, which is not a file earlier in the archive", hdr.Linkname)
		}
		e.Type, e.Size, e.Link = tar.TypeLink, 0, t
	case tar.TypeChar, tar.TypeBlock:
		return archiveEntry{}, bad("a device node; COPY takes files, directories and links")
	case tar.TypeFifo:
		return archiveEntry{}, bad("a named pipe; COPY takes files, directories and links")
	default:
		return archiveEntry{}, bad("tar type %q is not a file, directory or link", hdr.Typeflag)
	}
	if name == "" && e.Type != tar.TypeDir {
		return archiveEntry{}, bad("the archive's root must be a directory")
	}
	return e, nil
}

// relName is an entry's name as a clean relative path ("" for the root);
// an absolute name or one with a ".." element is refused.
func relName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", errors.New("an absolute name")
	}
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", errors.New("a name with a \"..\" element, which climbs out")
	}
	if c := path.Clean(name); c != "." {
		return c, nil
	}
	return "", nil
}

// capReader ends a stream past left bytes, noting it.
type capReader struct {
	r    io.Reader
	left int64
	read int64
	over bool
}

func (c *capReader) limit() int64 { return c.left + c.read }

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		c.over = true
		return 0, errdefs.New(errdefs.ErrTooLarge, "the archive unpacks to more than its limit")
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	c.read += int64(n)
	return n, err
}
