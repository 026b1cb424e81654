// Package filecopy moves files and directories into and out of a running
// sandbox as tar archives: what GET and PUT /api/sandboxes/{id}/files
// carry, and `sandboxd sandbox cp` sends and unpacks. It works over the
// file primitives of the sandbox's guest agent (FS) and never trusts what
// the guest says: names come from the agent's checked listings, each file
// is sent as exactly the size its header announced (a file that changed
// meanwhile fails the copy rather than corrupting the archive), and both
// directions are bounded in bytes and entries, an archive out before its
// first byte is sent.
//
// What is copied: regular files (with their permission bits), directories
// and, out of a sandbox, symbolic links as links. Into a sandbox, links and
// special files are skipped and reported (the agent has no primitive to
// make a link); directories are made with mode 0755.
package filecopy

import (
	"context"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
)

// Workdir is where a relative path in a sandbox starts: the working
// directory of its commands.
const Workdir = "/workspace"

// FS is a running sandbox's filesystem as the guest agent serves it.
// Errors wrap fs.ErrNotExist for a path that does not exist.
type FS interface {
	// Stat describes path without following a final symlink.
	Stat(ctx context.Context, path string) (Entry, error)
	// ListDir lists a directory without following symlinks.
	ListDir(ctx context.Context, path string) ([]Entry, error)
	// ReadFile streams a file's content.
	ReadFile(ctx context.Context, path string) (io.ReadCloser, error)
	// WriteFile replaces path with r's bytes (atomically), making its
	// parent directories.
	WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error
	// MakeDir makes a directory and its parents; one that exists is not an
	// error, anything else at path is.
	MakeDir(ctx context.Context, path string) error
}

// Entry is a file, directory or link as FS describes it.
type Entry struct {
	Name    string
	Size    int64
	Mode    fs.FileMode // type bits and permissions
	ModTime time.Time
	Link    string // a symlink's target
}

// Limits bound one copy.
type Limits struct {
	// Bytes is the most file content one archive carries.
	Bytes int64
	// Entries is the most files, directories and links it holds.
	Entries int
}

// DefaultLimits are the API's: as much as an upload to the repository
// may carry, in at most 100,000 entries.
var DefaultLimits = Limits{Bytes: 1 << 30, Entries: 100_000}

// maxDepth bounds how deep a copy out descends (a path of 4 KiB cannot
// hold many more levels).
const maxDepth = 256

// Resolve is path as a copy reads or writes it: absolute and clean, a
// relative path taken from Workdir.
func Resolve(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.New(errdefs.ErrInvalid, "path cannot be empty")
	case strings.ContainsRune(p, 0):
		return "", errdefs.New(errdefs.ErrInvalid, "path cannot contain NUL")
	case !path.IsAbs(p):
		p = path.Join(Workdir, p)
	}
	return path.Clean(p), nil
}

// notFound is the error for a path that is not in the sandbox.
func notFound(p string) error {
	return errdefs.Newf(errdefs.ErrNotFound, "No such file or directory in the sandbox: %s", p)
}
