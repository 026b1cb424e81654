package mcpserver

import (
	"context"
	"io"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// SandboxService is what the tools do with sandboxes (internal/sandbox's
// Manager); its errors are errdefs classes, told through edge.Explain.
type SandboxService interface {
	// Create places a sandbox for account and, with a command or prompt,
	// starts a run in it.
	Create(ctx context.Context, accountID string, req sandbox.CreateRequest) (sb store.Sandbox, runID string, err error)
	// Live refreshes rows with the status their hosts report.
	Live(ctx context.Context, sbs []store.Sandbox) []store.Sandbox
	// Exec runs a command in a running sandbox, streaming its output.
	Exec(ctx context.Context, sb store.Sandbox, req sandbox.ExecRequest, stdout, stderr io.Writer) (sandbox.ExecResult, error)
	// Stop stops a sandbox; stopping a stopped sandbox is not an error.
	Stop(ctx context.Context, sb store.Sandbox) (store.Sandbox, error)
}

// FileService is the account's repository, as the REST API's file routes
// use it.
type FileService = contract.FileService
