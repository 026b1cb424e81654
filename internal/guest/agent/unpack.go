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
	out, err := unpackTar(path.Clean(dir), r.Body)
	if err != nil {
		fileError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// unpackTar writes the tar archive src under dir (see postUnpack).
func unpackTar(dir string, src io.Reader) (guest.Unpacked, error) {
	var out guest.Unpacked
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return out, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return out, err
	}
	defer root.Close()
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
		if err := unpackEntry(root, name, hdr, tr, &out); err != nil {
			return out, fmt.Errorf("%s: %w", name, err)
		}
	}
}

// unpackEntry writes one entry of an archive under root.
func unpackEntry(root *os.Root, name string, hdr *tar.Header, r io.Reader, out *guest.Unpacked) error {
	perm := fs.FileMode(hdr.Mode).Perm()
	if parent := path.Dir(name); parent != "." {
		if err := root.MkdirAll(parent, 0o755); err != nil {
			return err
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, perm); err != nil {
			return err
		}
		out.Directories++
		return root.Chmod(name, perm) // MkdirAll's mode went through the umask
	case tar.TypeReg:
		// A file or link already there is replaced, not written through.
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
		if err != nil {
			return err
		}
		n, err := io.Copy(f, r)
		if err == nil {
			err = f.Chmod(perm)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		out.Files++
		out.Bytes += n
		return err
	case tar.TypeSymlink:
		if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		out.Links++
		// The link's target is only text: os.Root never follows it out
		// of the directory when a later entry is written through it.
		return root.Symlink(hdr.Linkname, name)
	}
	return badRequest("entry %q: type %q is not a directory, file or symbolic link", hdr.Name, hdr.Typeflag)
}
