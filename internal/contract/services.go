package contract

import (
	"context"
	"io"
	"mime/multipart"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
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

// SandboxService is the part of internal/sandbox's Manager that the REST
// API and MCP both drive: create (with a run), refresh, exec and stop. Its
// errors are errdefs classes, told through edge.Explain.
type SandboxService interface {
	// Create places a sandbox for account and, with a command or prompt,
	// starts a run in it. The returned row's status is true when returned.
	Create(ctx context.Context, accountID string, req sandbox.CreateRequest) (sb store.Sandbox, runID string, err error)
	// Live refreshes rows with the status their hosts report.
	Live(ctx context.Context, sbs []store.Sandbox) []store.Sandbox
	// Exec runs a command in a running sandbox, streaming its output.
	Exec(ctx context.Context, p auth.Principal, id string, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error)
	// Stop stops a sandbox; stopping a stopped sandbox is not an error.
	Stop(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
}
