package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The files of a running sandbox (sandboxd): GET and PUT
// /api/sandboxes/{id}/files move files and directories out of and into it
// as tar archives (what `sandboxd sandbox cp` carries), and GET
// .../files/stat says what a path is, so that a client can choose where a
// copy goes. Unlike /api/sandboxes/file(s), which are the account's
// repository, these are the sandbox's live filesystem.

// SandboxFileService moves files into and out of running sandboxes
// (internal/sandbox over internal/filecopy). Paths are absolute, or
// relative to /workspace.
type SandboxFileService interface {
	// StatPath describes path without following a final link, and returns
	// it resolved.
	StatPath(ctx context.Context, p auth.Principal, id, path string) (string, filecopy.Entry, error)
	// ArchiveOut measures the tar archive of path, refused past lim.
	ArchiveOut(ctx context.Context, p auth.Principal, id, path string, lim filecopy.Limits) (*filecopy.Archive, error)
	// ExtractIn writes the tar archive r into the directory dir.
	ExtractIn(ctx context.Context, p auth.Principal, id, dir string, r io.Reader, lim filecopy.Limits) (filecopy.Extracted, error)
}

// tarType is the media type of the archives.
const tarType = "application/x-tar"

// readsSandbox is why a sandbox's key may not read another sandbox's files
// (route.acts): they are as much of it as an exec would reach.
const readsSandbox = "it reads a running sandbox's files, as an exec would"

// maxArchiveBody bounds a PUT's body: the content filecopy takes, and the
// tar headers and padding of its entries.
var maxArchiveBody = filecopy.DefaultLimits.Bytes + int64(filecopy.DefaultLimits.Entries)*1024

// SandboxPathQuery is the query of the routes on a sandbox's files.
type SandboxPathQuery struct {
	Path      string `json:"path" jsonschema:"minLength=1,description=A path in the sandbox: absolute, or relative to /workspace"`
	AccountID string `json:"account_id,omitempty" jsonschema:"format=uuid"`
}

func (q SandboxPathQuery) actingFor() string { return q.AccountID }

// PathStatResponse answers GET /api/sandboxes/{id}/files/stat.
type PathStatResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
	// Path is the path resolved: absolute and clean.
	Path          string `json:"path"`
	Type          string `json:"type" jsonschema:"enum=file,enum=directory,enum=symlink,enum=other"`
	Size          int64  `json:"size"`
	Mode          string `json:"mode" jsonschema:"description=Permission bits in octal, e.g. 0644"`
	ModifiedAt    string `json:"modifiedAt" jsonschema:"format=date-time"`
	SymlinkTarget string `json:"symlinkTarget,omitempty"`
}

// CopyInResponse answers PUT /api/sandboxes/{id}/files.
type CopyInResponse struct {
	Status      string `json:"status" jsonschema:"enum=success"`
	Files       int    `json:"files" jsonschema:"description=Regular files written"`
	Directories int    `json:"directories" jsonschema:"description=Directories of the archive made (or found)"`
	Bytes       int64  `json:"bytes" jsonschema:"description=Content written"`
	// Skipped names the entries that were not written (links, special
	// files) and why.
	Skipped []string `json:"skipped,omitempty"`
}

// parseSandboxPath validates the query of the routes on a sandbox's files.
func parseSandboxPath(q url.Values) (SandboxPathQuery, error) {
	var out SandboxPathQuery
	if !q.Has("path") {
		return out, errBadRequest("path is required")
	}
	if out.Path = q.Get("path"); out.Path == "" {
		return out, errBadRequest("path cannot be empty")
	}
	var err error
	out.AccountID, err = queryAccountID(q)
	return out, err
}

// sandboxOfPathQuery is the start of the routes on a sandbox's files: the
// query, and the sandbox if the caller may act on it.
func (s *Server) sandboxOfPathQuery(r *http.Request) (SandboxPathQuery, store.Sandbox, error) {
	q, err := parseSandboxPath(r.URL.Query())
	if err != nil {
		return q, store.Sandbox{}, err
	}
	sb, err := s.sandboxFor(r, q.AccountID)
	if err != nil {
		return q, sb, err
	}
	if s.opts.SandboxFiles == nil {
		return q, sb, errNotAvailable
	}
	return q, sb, nil
}

func (s *Server) statSandboxPath(w http.ResponseWriter, r *http.Request) error {
	q, sb, err := s.sandboxOfPathQuery(r)
	if err != nil {
		return err
	}
	p, e, err := s.opts.SandboxFiles.StatPath(r.Context(), principal(r), sb.ID, q.Path)
	if err != nil {
		return fileError(err)
	}
	writeJSON(w, http.StatusOK, PathStatResponse{
		Status: "success", Path: p, Type: entryType(e.Mode), Size: e.Size,
		Mode: fmt.Sprintf("%04o", e.Mode.Perm()), ModifiedAt: formatTime(e.ModTime), SymlinkTarget: e.Link,
	})
	return nil
}

// fileError maps a file service's error: a path that is not in the
// sandbox is 404 with the message that names it.
func fileError(err error) error {
	if errors.Is(err, errdefs.ErrNotFound) {
		return errNotFound(errdefs.Message(err, "No such file or directory in the sandbox"))
	}
	return serviceError(err, "Sandbox not found")
}

// entryType names a file's type as PathStatResponse does.
func entryType(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "file"
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "other"
}

func (s *Server) copyOut(w http.ResponseWriter, r *http.Request) error {
	q, sb, err := s.sandboxOfPathQuery(r)
	if err != nil {
		return err
	}
	a, err := s.opts.SandboxFiles.ArchiveOut(r.Context(), principal(r), sb.ID, q.Path, filecopy.DefaultLimits)
	if err != nil {
		return fileError(err)
	}
	w.Header().Set("Content-Type", tarType)
	w.WriteHeader(http.StatusOK)
	// The client learns at once that the copy was accepted, however long
	// its first file takes to read.
	_ = http.NewResponseController(w).Flush()
	if err := a.WriteTar(r.Context(), w); err != nil {
		// The answer has begun: break it off, so that the client sees a
		// broken transfer rather than an archive that merely ends early.
		if r.Context().Err() == nil {
			s.log.WarnContext(r.Context(), "copy out of a sandbox broke off", "sandbox_id", sb.ID, "err", err, "request_id", requestID(r.Context()))
		}
		panic(http.ErrAbortHandler)
	}
	return nil
}

func (s *Server) copyIn(w http.ResponseWriter, r *http.Request) error {
	q, sb, err := s.sandboxOfPathQuery(r)
	if err != nil {
		return err
	}
	body := http.MaxBytesReader(w, r.Body, maxArchiveBody)
	res, err := s.opts.SandboxFiles.ExtractIn(r.Context(), principal(r), sb.ID, q.Path, body, filecopy.DefaultLimits)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &Error{Status: http.StatusRequestEntityTooLarge, Msg: fmt.Sprintf("The archive is larger than %d bytes, the most one copy carries; copy less at once", maxArchiveBody)}
		}
		return fileError(err)
	}
	writeJSON(w, http.StatusOK, CopyInResponse{Status: "success", Files: res.Files, Directories: res.Directories, Bytes: res.Bytes, Skipped: res.Skipped})
	return nil
}
