package contract

import (
	"context"
	"mime/multipart"

	"github.com/sandboxd/sandboxd/internal/files"
)

// FileService reads and writes the account's repository (internal/repo):
// the service behind the contract's file routes, in the REST API and MCP
// alike.
type FileService interface {
	// RepoURL is the account's repository URL, or "" when it has none.
	RepoURL(ctx context.Context, accountID string) (string, error)
	// Tree lists main of the account's repository recursively, up to the
	// server's limits; truncated says the listing was cut there.
	Tree(ctx context.Context, accountID string) (entries []FileTreeEntry, truncated bool, err error)
	// Read returns a file of main, resolving git submodules.
	Read(ctx context.Context, accountID, path string) ([]byte, error)
	// Upload downloads files into the repository in one commit and reports
	// per-file failures.
	Upload(ctx context.Context, accountID string, req files.Upload) (uploaded []UploadedFile, failures []string, err error)
	// UploadMultipart commits the file parts of a multipart/form-data
	// body (parts named "file", fields "path" and "message").
	UploadMultipart(ctx context.Context, accountID string, mr *multipart.Reader) (uploaded []UploadedFile, failures []string, err error)
}
