package sandbox

import (
	"io"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/volumes"

	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// The requests the manager serves, in the domain's terms: parsed and
// validated once at the edge (internal/api and internal/mcpserver map their
// JSON to these), so that the manager checks only what depends on its own
// settings (the longest lifetime, the image's CLIs, networking enabled).

// CreateRequest is a sandbox to create.
type CreateRequest struct {
	Lifetime time.Duration // 0: the server's default
	// Command runs at once in the new sandbox as a run (with Args in Cwd,
	// default /workspace); Prompt instead runs `opencode run` on it.
	Command string
	Args    []string
	Cwd     string
	Prompt  string
	Network *netpol.Policy // nil: the server's default policy
	// OnTimeout is what the deadline does: "" stops the sandbox,
	// store.OnTimeoutPause pauses it with its memory (the runtime must be
	// able to), store.OnTimeoutPauseFiles with its files alone
	// (pausefiles.go).
	OnTimeout string
	// Template is "name[:tag]" of the account's (or a public) template to
	// start from instead of the built-in image ("": the built-in one).
	Template string
	// Snapshot is "name[:tag]" (or the id) of the account's named
	// snapshot to start from instead (not with Template).
	Snapshot string
	// Volumes are the account's volumes to mount (package volumes).
	Volumes []volumes.Mount
}

// ExecRequest is a command to run in a running sandbox.
type ExecRequest struct {
	Command string
	Args    []string
	Cwd     string            // default /workspace
	Env     map[string]string // added to the sandbox's environment
	Stdin   string
	Timeout time.Duration // 0: until the sandbox's deadline
	// PTY runs the command on a terminal of this size; its output is one
	// stream (stdout).
	PTY *runtime.WindowSize
	// Input streams the command's input (instead of Stdin); Resize and
	// Signal reach the running command (an interactive session).
	Input  io.Reader
	Resize <-chan runtime.WindowSize
	Signal <-chan syscall.Signal
	// Detach leaves the command running when the caller's context ends
	// (Exec then returns the context's error): it belongs to the sandbox,
	// is listed with its processes, and still ends at Timeout or the
	// sandbox's deadline. Without it the command dies with its caller.
	Detach bool
}

// CodingAgentRequest is a coding-agent task: Claude Code on Prompt in a
// clone of RepoURL at BaseBranch (default main), its work pushed to a
// branch and offered as a pull request.
type CodingAgentRequest struct {
	RepoURL    string
	Prompt     string
	BaseBranch string
}

// ExecResult is how a command run through Manager.Exec ended.
type ExecResult struct {
	ExitCode int
	// OOMKilled: it (or one of its processes) was killed for the
	// sandbox's memory limit.
	OOMKilled bool
	// TimedOut: it was killed because its timeout (or the sandbox's
	// deadline, when that came first) passed.
	TimedOut bool
}
