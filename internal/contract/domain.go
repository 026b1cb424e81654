package contract

import (
	"time"

	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// The bodies, validated, in the services' terms: each field is parsed and
// checked once, by the parse functions of validate.go, and mapped here.

// Domain is the body as the sandbox manager's request.
func (r CreateSandboxRequest) Domain() sandbox.CreateRequest {
	req := sandbox.CreateRequest{
		Lifetime: time.Duration(r.Timeout) * time.Millisecond,
		Command:  r.Command, Args: r.Args, Cwd: r.Cwd, Prompt: r.Prompt, Network: r.Network,
		Template: r.Template, Snapshot: r.Snapshot, OnTimeout: r.OnTimeout,
	}
	for _, v := range r.Volumes {
		req.Volumes = append(req.Volumes, volumes.Mount{Name: v.Name, Path: v.Path, ReadOnly: v.ReadOnly})
	}
	return req
}

// Domain is the body as the sandbox manager's request.
func (r ExecRequest) Domain() sandbox.ExecRequest {
	req := sandbox.ExecRequest{
		Command: r.Command, Args: r.Args, Cwd: r.Cwd, Env: r.Env, Stdin: r.Stdin,
		Timeout: time.Duration(r.Timeout) * time.Millisecond,
		// A process survives its caller unless it was started to die
		// with it (E2B's semantics).
		Detach: !r.KillOnDisconnect,
	}
	if r.PTY != nil {
		req.PTY = &runtime.WindowSize{Rows: uint16(r.PTY.Rows), Cols: uint16(r.PTY.Cols)}
	}
	return req
}

// Domain is the body as the agent service's request.
func (r CodingAgentRequest) Domain() sandbox.CodingAgentRequest {
	return sandbox.CodingAgentRequest{RepoURL: r.RepoURL, Prompt: r.Prompt, BaseBranch: r.BaseBranch}
}

// Domain is the body as the file service's request.
func (r UploadFilesRequest) Domain() files.Upload {
	up := files.Upload{Files: make([]files.Source, len(r.Files)), Dir: r.Path, Message: r.Message}
	for i, f := range r.Files {
		up.Files[i] = files.Source{URL: f.URL, Name: f.Name}
	}
	return up
}
