package agent

import (
	"cmp"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Bounds on POST /files. A plain body is bounded by what it costs its
// sender and by the disk it fills (ENOSPC: 507); a gzip body is not — a
// few kilobytes can decompress to gigabytes — so what it decompresses to
// is bounded by Options.MaxGzipBytes.
const (
	// maxUploadParts bounds the parts of one multipart body (all parts,
	// files or not): Go's own bound on a form's parts
	// (multipart.Reader.ReadForm). Each file is streamed to disk, so the
	// parts cost time and the answer's size, not memory.
	maxUploadParts = 1000
	// DefaultMaxGzipBytes is the default of Options.MaxGzipBytes: 1 GiB,
	// what sandboxd's own upload route takes in one request
	// (files.DefaultMaxUploadBytes).
	DefaultMaxGzipBytes = 1 << 30
)

// errTooLarge is a gzip body that decompresses to more than
// Options.MaxGzipBytes (413).
var errTooLarge = errors.New("request body too large")

// requestError is a malformed request: the caller's mistake (400).
type requestError struct{ msg string }

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{fmt.Sprintf(format, args...)}
}

// written describes one file a POST /files wrote (envd's EntryInfo, with
// the size the host checks).
type written struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
}

// postFile writes the files of a request, as envd does:
//
//   - a multipart body (what the e2b SDK sends by default) writes one file
//     per part named "file" (other parts are skipped), to the path query
//     parameter when there is one and otherwise to the part's file name
//     (a path, relative ones against the home), each path once;
//   - any other body is the one file at the path query parameter (which
//     is then required);
//   - Content-Encoding: gzip is decompressed first (the SDK's gzip
//     writes send octet-stream bodies so).
//
// The answer lists the files written, in order. A file that fails ends
// the request with its error; the files before it stay written. Acting as
// a user, the files are written with its credentials (writeFile).
func (a *Agent) postFile(w http.ResponseWriter, r *http.Request) {
	u, err := a.requestUser(r.Header)
	if err != nil {
		fileError(w, err)
		return
	}
	q := r.URL.Query()
	var mode fs.FileMode
	if m := q.Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil {
			fileError(w, badRequest("mode %q: not octal", m))
			return
		}
		mode = fs.FileMode(v).Perm()
	}
	envd := envdAnswers(r.Header)
	var md map[string]string
	if envd {
		// envd's file metadata: set on every file written.
		if md, err = uploadMetadata(r.Header); err != nil {
			fileError(w, err)
			return
		}
	}
	body, err := a.uploadBody(r)
	if err != nil {
		fileError(w, err)
		return
	}
	var out []written
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if strings.HasPrefix(mt, "multipart/") {
		out, err = a.postParts(u, multipart.NewReader(body, params["boundary"]), q.Get("path"), mode, envd, md)
	} else {
		var path string
		if q.Get("path") == "" {
			err = badRequest("the path query parameter is required for a body that is not multipart")
		} else if path, err = a.abs(q.Get("path"), u); err == nil {
			var f written
			f, err = a.writeFile(u, path, mode, body, envd, md)
			out = append(out, f)
		}
	}
	if err != nil {
		fileError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if envd {
		// envd's answer names each file and the metadata it has (read
		// back: none where the file system keeps none), no more.
		entries := make([]envdWritten, len(out))
		for i, f := range out {
			entries[i] = envdWritten{Name: f.Name, Path: f.Path, Type: f.Type}
			_ = asUser(u, func() error { entries[i].Metadata = readMetadata(f.Path); return nil })
		}
		_ = json.NewEncoder(w).Encode(entries)
		return
	}
	_ = json.NewEncoder(w).Encode(out)
}

// envdWritten is envd's answer for a file written (its EntryInfo).
type envdWritten struct {
	Name     string            `json:"name"`
	Path     string            `json:"path"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// postParts writes the files of a multipart body: see postFile.
func (a *Agent) postParts(u *account, mr *multipart.Reader, path string, mode fs.FileMode, envd bool, md map[string]string) ([]written, error) {
	var out []written
	seen := map[string]bool{}
	for n := 0; ; n++ {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("multipart body: %w", asRequestError(err))
		}
		if n == maxUploadParts {
			return nil, badRequest("more than %d parts in a multipart body", maxUploadParts)
		}
		if part.FormName() != "file" {
			continue // NextPart skips what is left of it
		}
		name := path
		if name == "" {
			// Not part.FileName(): it keeps only the last element.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if name = dp["filename"]; name == "" {
				return nil, badRequest("part %d has no file name, and there is no path query parameter", n+1)
			}
		}
		p, err := a.abs(name, u)
		if err != nil {
			return nil, err
		}
		if seen[p] {
			return nil, badRequest("more than one file for %s in one upload; the files before it were written", p)
		}
		seen[p] = true
		f, err := a.writeFile(u, p, mode, part, envd, md)
		if err != nil {
			return nil, err
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, badRequest(`no part named "file" in the multipart body`)
	}
	return out, nil
}

// asRequestError makes a failure to parse the body the caller's, unless
// it is already classified (a gzip body too large).
func asRequestError(err error) error {
	var re *requestError
	if errors.Is(err, errTooLarge) || errors.As(err, &re) {
		return err
	}
	return &requestError{err.Error()}
}

// uploadBody is r's body as the files' bytes: decompressed for
// Content-Encoding gzip, bounded by Options.MaxGzipBytes.
func (a *Agent) uploadBody(r *http.Request) (io.Reader, error) {
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
		return r.Body, nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, badRequest("gzip body: %v", err)
		}
		return &gunzipBody{zr: zr, left: a.opts.MaxGzipBytes, max: a.opts.MaxGzipBytes}, nil
	default:
		return nil, badRequest("Content-Encoding %q: only gzip is supported", enc)
	}
}

// gunzipBody reads a gzip body, failing with errTooLarge past max bytes
// of content and with a requestError on a corrupt stream.
type gunzipBody struct {
	zr        *gzip.Reader
	left, max int64
}

func (g *gunzipBody) Read(p []byte) (int, error) {
	if g.left == 0 {
		// Exactly max bytes is allowed: only a further byte is too many.
		var b [1]byte
		if n, err := io.ReadFull(g.zr, b[:]); n > 0 {
			return 0, fmt.Errorf("%w: a gzip body decompresses to more than %d bytes", errTooLarge, g.max)
		} else if !errors.Is(err, io.EOF) {
			return 0, badRequest("gzip body: %v", err)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > g.left {
		p = p[:g.left]
	}
	n, err := g.zr.Read(p)
	g.left -= int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		err = badRequest("gzip body: %v", err)
	}
	return n, err
}

// writeFile replaces path with src's bytes through a temporary file next
// to it, so readers never see a partial file and a broken upload leaves
// nothing, creating the parents it needs. mode 0 keeps the mode of the
// file it replaces (0644 for a new one). envd asks for envd's write
// instead (writeInPlace).
//
// Acting as a user, every step that resolves a path or makes, changes or
// removes an entry runs on the user's thread (asUser), where the kernel
// checks the user's permissions and follows symlinks as the user: the
// parents, the temporary file, its mode, the rename and the cleanup. What
// the user creates is thereby its own, with no chown. The bytes are copied
// in between, on the request's goroutine: the file is open for writing
// and writes to an open file are not checked again, so the copy — which
// waits on the network — does not hold a thread of its own for its
// length.
func (a *Agent) writeFile(u *account, path string, mode fs.FileMode, src io.Reader, envd bool, md map[string]string) (written, error) {
	if envd {
		return a.writeInPlace(u, path, mode, src, md)
	}
	var tmp *os.File
	err := asUser(u, func() error {
		if mode == 0 {
			mode = 0o644
			if fi, err := os.Stat(path); err == nil {
				mode = fi.Mode().Perm()
			}
		}
		dir := filepath.Dir(path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var err error
		tmp, err = os.CreateTemp(dir, "."+filepath.Base(path)+".sandboxd-*")
		return err
	})
	if err != nil {
		return written{}, err
	}
	size, err := io.Copy(tmp, src)
	done := false
	if uerr := asUser(u, func() error {
		done = true
		if err == nil {
			err = tmp.Chmod(mode)
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
		return nil
	}); !done {
		// The user's thread could not be had again (it was a moment ago):
		// close the file, and leave its name rather than remove it as root.
		tmp.Close()
		a.log.Warn("upload: temporary file left", "path", tmp.Name(), "err", uerr)
		return written{}, uerr
	}
	if err != nil {
		return written{}, err
	}
	return written{Name: filepath.Base(path), Type: "file", Path: path, Size: size}, nil
}

// writeInPlace is envd's write, for the E2B front end (guest.EnvdHeader):
// the missing parents are made as envd makes them (ensureParents), and the
// file is truncated and written where it is, so a watcher sees the write
// (and the create of a new file) as it does with envd, not the create and
// rename of a temporary file. mode 0 keeps an existing file's mode (0644
// for a new one). The file itself is opened, and its mode set, as the
// user: a file the user may not write stays refused. Its metadata is then
// replaced with md (none clears it, as envd's O_TRUNC write does), as the
// user.
func (a *Agent) writeInPlace(u *account, path string, mode fs.FileMode, src io.Reader, md map[string]string) (written, error) {
	if err := ensureParents(u, filepath.Dir(path)); err != nil {
		return written{}, err
	}
	var f *os.File
	err := asUser(u, func() error {
		var err error
		// Non-blocking: a FIFO with no reader is refused (ENXIO) rather
		// than holding the request, and its thread, until one comes.
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, cmp.Or(mode, 0o644)); err != nil {
			return err
		}
		if fi, err := f.Stat(); err != nil {
			return err
		} else if !fi.Mode().IsRegular() {
			return &fs.PathError{Op: "write", Path: path, Err: errors.New("not a regular file")}
		}
		if mode != 0 {
			err = f.Chmod(mode)
		}
		return err
	})
	if err != nil {
		if f != nil {
			f.Close()
		}
		return written{}, err
	}
	size, err := io.Copy(f, src)
	if err == nil {
		if merr := asUser(u, func() error { return writeMetadata(f, md) }); merr != nil {
			if xattrUnsupported(merr) {
				a.log.Warn("upload: the file system keeps no extended attributes; metadata not kept", "path", path)
			} else {
				err = merr
			}
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return written{}, err
	}
	return written{Name: filepath.Base(path), Type: "file", Path: path, Size: size}, nil
}

// ensureParents makes dir and its missing parents as envd does: mode 0755
// and owned by the user. The user makes what it may (as itself); what it
// may not, a directory in one only root may write (as / is), the agent
// makes and gives to the user, one component at a time from /, never
// following a symbolic link (no link the user planted can point the
// agent's own mkdir elsewhere: a path through one is refused there) and
// only below directories the user may enter (nothing is made where the
// user could not reach it).
func ensureParents(u *account, dir string) error {
	err := asUser(u, func() error { return os.MkdirAll(dir, 0o755) })
	if err == nil || u == nil || !errors.Is(err, fs.ErrPermission) {
		return err
	}
	fd, err := unix.Open("/", unix.O_DIRECTORY|unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: "/", Err: err}
	}
	at := "/"
	for _, name := range strings.Split(strings.Trim(filepath.Clean(dir), "/"), "/") {
		if name == "" {
			continue
		}
		at = filepath.Join(at, name)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || !searchable(&st, u) {
			unix.Close(fd)
			return &fs.PathError{Op: "mkdir", Path: at, Err: fs.ErrPermission}
		}
		next, err := unix.Openat(fd, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_PATH|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(fd, name, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				if err = unix.Fchownat(fd, name, int(u.uid), int(u.gid), unix.AT_SYMLINK_NOFOLLOW); err == nil {
					next, err = unix.Openat(fd, name, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_PATH|unix.O_CLOEXEC, 0)
				}
			}
		}
		unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				// What the user could not pass as itself is not passed
				// for it by following a link.
				return &fs.PathError{Op: "mkdir", Path: at, Err: fmt.Errorf("%w: not a directory (a symbolic link is not followed here)", fs.ErrPermission)}
			}
			return &fs.PathError{Op: "mkdir", Path: at, Err: err}
		}
		fd = next
	}
	unix.Close(fd)
	return nil
}

// searchable says whether u may enter the directory st describes, by its
// mode bits (the agent, root, cannot ask the kernel for u).
func searchable(st *unix.Stat_t, u *account) bool {
	switch {
	case st.Uid == u.uid:
		return st.Mode&0o100 != 0
	case slices.Contains(u.groups, st.Gid) || st.Gid == u.gid:
		return st.Mode&0o010 != 0
	default:
		return st.Mode&0o001 != 0
	}
}
