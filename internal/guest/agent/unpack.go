package agent

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/internal/guest"
)

// maxUnpackEntries bounds the entries of one POST /unpack: the host builds
// the archive (a workspace), but from a repository sandboxes push to.
const maxUnpackEntries = 1 << 20

// postUnpack writes the tar archive of the body into the directory named
// by the path query parameter, made when missing, in one request: the
// host lays out a sandbox's /workspace so without starting a process (a
// process costs tens of milliseconds under gVisor's sentry, and the
// workspace is on the way to a sandbox's first command).
//
// Only the host asks, as the agent itself: a request that acts as a user
// (UserHeader, which every request forwarded for E2B's SDK carries) is
// refused. Entries are directories, regular files and symbolic links;
// anything else is refused. Every name is resolved inside the directory
// through an os.Root, so neither a name nor a link an earlier entry made
// reaches outside it. Modes are the entries' permission bits, times are
// now (as a checkout's are). Entries are written as they arrive: a body
// that fails midway leaves those before it.
func (a *Agent) postUnpack(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(guest.UserHeader) != "" {
		fileError(w, badRequest("unpack is the host's, as the agent itself: no %s", guest.UserHeader))
		return
	}
	dir := r.URL.Query().Get("path")
	if !path.IsAbs(dir) || strings.ContainsRune(dir, 0) {
		fileError(w, badRequest("path %q: an absolute directory is required", dir))
		return
	}
	out, err := unpackTar(path.Clean(dir), r.Body, a.umask)
	if err != nil {
		fileError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// unpackTar writes the tar archive src under dir (see postUnpack).
func unpackTar(dir string, src io.Reader, umask fs.FileMode) (guest.Unpacked, error) {
	var out guest.Unpacked
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return out, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return out, err
	}
	u := &unpacker{dirs: map[string]*os.Root{".": root}, umask: umask, out: &out}
	defer u.close()
	tr := tar.NewReader(src)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, badRequest("the body is not a whole tar archive (after %d entries): %v", n, err)
		}
		if n >= maxUnpackEntries {
			return out, badRequest("the archive holds more than %d entries", maxUnpackEntries)
		}
		name := path.Clean(strings.TrimPrefix(hdr.Name, "./"))
		if name == "." && hdr.Typeflag == tar.TypeDir {
			continue
		}
		if !fs.ValidPath(name) || name == "." {
			return out, badRequest("entry %q: not a relative path inside the directory", hdr.Name)
		}
		if err := u.entry(name, hdr, tr); err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
	}
}

// unpacker writes an archive's entries. Every file system call is one
// relative to an open directory (a gofer round trip each under gVisor,
// where a walk from the top for every entry cost a millisecond an entry):
// the directories made are kept open as os.Roots, each a child of its
// parent's, so nothing resolves outside the top one.
type unpacker struct {
	dirs map[string]*os.Root // by name relative to the top; "." is the top
	// umask is the process's: a mode it strips is set again after a
	// create.
	umask fs.FileMode
	out   *guest.Unpacked
}

func (u *unpacker) close() {
	for _, r := range u.dirs {
		r.Close()
	}
}

// dir is the open directory name, made (with its parents) when missing.
func (u *unpacker) dir(name string, perm fs.FileMode) (*os.Root, error) {
	if r, ok := u.dirs[name]; ok {
		return r, nil
	}
	parent, err := u.dir(path.Dir(name), 0o755)
	if err != nil {
		return nil, err
	}
	base := path.Base(name)
	if err := parent.Mkdir(base, perm); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	r, err := parent.OpenRoot(base)
	if err != nil {
		return nil, err
	}
	u.dirs[name] = r
	return r, nil
}

// entry writes one entry of an archive.
func (u *unpacker) entry(name string, hdr *tar.Header, r io.Reader) error {
	perm := fs.FileMode(hdr.Mode).Perm()
	switch hdr.Typeflag {
	case tar.TypeDir:
		_, existed := u.dirs[name]
		d, err := u.dir(name, perm)
		if err != nil {
			return err
		}
		u.out.Directories++
		if existed || perm&^u.umask == perm {
			return nil
		}
		return d.Chmod(".", perm) // Mkdir's mode went through the umask
	case tar.TypeReg:
		parent, err := u.dir(path.Dir(name), 0o755)
		if err != nil {
			return err
		}
		base := path.Base(name)
		f, err := parent.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if errors.Is(err, fs.ErrExist) {
			// A file or link already there is replaced, not written
			// through.
			if err = parent.Remove(base); err == nil {
				f, err = parent.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
			}
		}
		if err != nil {
			return err
		}
		n, err := io.Copy(f, r)
		if err == nil && perm&^u.umask != perm {
			err = f.Chmod(perm)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		u.out.Files++
		u.out.Bytes += n
		return err
	case tar.TypeSymlink:
		parent, err := u.dir(path.Dir(name), 0o755)
		if err != nil {
			return err
		}
		base := path.Base(name)
		if err := parent.Remove(base); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		u.out.Links++
		// The link's target is only text: os.Root never follows it out
		// of the directory when a later entry is written through it.
		return parent.Symlink(hdr.Linkname, base)
	}
	return badRequest("entry %q: type %q is not a directory, file or symbolic link", hdr.Name, hdr.Typeflag)
}

// processUmask is the process's file mode creation mask. The agent reads
// it once, at its start (New): reading it means setting it, which must
// not race with files being made.
func processUmask() fs.FileMode {
	m := unix.Umask(0o022)
	unix.Umask(m)
	return fs.FileMode(m)
}
