package mcpserver

import "github.com/sandboxd/sandboxd/internal/contract"

// SandboxService is what the tools do with sandboxes: create (with a run),
// refresh, exec and stop, as the REST API's routes of those names do.
type SandboxService = contract.SandboxService

// FileService is the account's repository, as the REST API's file routes
// use it.
type FileService = contract.FileService
