package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
)

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

// postFile replaces a file with the request's body (or the first file of a
// multipart form). Acting as a user, the file is written with its
// credentials (writeFile).
func (a *Agent) postFile(w http.ResponseWriter, r *http.Request) {
	u, err := a.requestUser(r.Header)
	if err != nil {
		fileError(w, err)
		return
	}
	path, err := a.abs(r.URL.Query().Get("path"), u)
	if err != nil {
		fileError(w, err)
		return
	}
	var mode fs.FileMode
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil {
			fileError(w, badRequest("mode %q: not octal", m))
			return
		}
		mode = fs.FileMode(v).Perm()
	}
	body := io.Reader(r.Body)
	if mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mt == "multipart/form-data" {
		part, err := multipart.NewReader(r.Body, params["boundary"]).NextPart()
		if err != nil {
			fileError(w, badRequest("multipart body: %v", err))
			return
		}
		body = part
	}
	f, err := a.writeFile(u, path, mode, body)
	if err != nil {
		fileError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode([]written{f})
}

// writeFile replaces path with src's bytes through a temporary file next
// to it, so readers never see a partial file and a broken upload leaves
// nothing, creating the parents it needs. mode 0 keeps the mode of the
// file it replaces (0644 for a new one).
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
func (a *Agent) writeFile(u *account, path string, mode fs.FileMode, src io.Reader) (written, error) {
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
