package sandbox

import (
	"context"
	"io"
	"net/http"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/filecopy"
	"github.com/sandboxd/sandboxd/internal/guest/codeint"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The entry points in this file are what the front ends (api, e2b,
// mcpserver) call on one sandbox: each takes the caller and the sandbox's
// id, loads the row under the one access rule (Access) and acts on the row
// as it is now. A sandbox the caller may not see is errdefs.ErrNotFound,
// whichever front end asks. What the service does for itself (the reaper,
// runs, agents, jobs) works on rows, unexported here.

// Access is the one access rule for a sandbox by id:
// auth.Authenticator.SandboxFor. account "" asks for any account the
// principal may act for.
type Access interface {
	SandboxFor(ctx context.Context, p auth.Principal, id, account string) (store.Sandbox, error)
}

// sandboxFor loads sandbox id for p under the access rule.
func (m *Manager) sandboxFor(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	return m.access.SandboxFor(ctx, p, id, "")
}

// Stop stops sandbox id; stopping a stopped sandbox is not an error.
func (m *Manager) Stop(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, err
	}
	return m.stopByRequest(ctx, sb)
}

// SetTimeout makes sandbox id stop d from now (d from its resume, when it
// is paused).
func (m *Manager) SetTimeout(ctx context.Context, p auth.Principal, id string, d time.Duration) (store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, err
	}
	return m.setTimeout(ctx, sb, d)
}

// Pause saves running sandbox id whole (memory, processes, files) and
// stops it running and its deadline clock; a paused one is answered as it
// is.
func (m *Manager) Pause(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, err
	}
	return m.pause(ctx, sb)
}

// PauseFiles pauses running sandbox id with its files alone: they are
// saved in the blob store, its processes and memory end, and a resume
// starts it again from them on any node (pausefiles.go); a paused one is
// answered as it is.
func (m *Manager) PauseFiles(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, err
	}
	return m.pauseFiles(ctx, sb)
}

// Resume brings paused sandbox id back where it was; a running one is
// answered as it is.
func (m *Manager) Resume(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, err
	}
	return m.resumeSandbox(ctx, sb)
}

// Fork starts count sandboxes from running sandbox id's memory and
// filesystem, each living lifetime (0: the default).
func (m *Manager) Fork(ctx context.Context, p auth.Principal, id string, count int, lifetime time.Duration) ([]store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return m.fork(ctx, sb, count, lifetime)
}

// SetNetwork replaces running sandbox id's network policy without
// restarting it.
func (m *Manager) SetNetwork(ctx context.Context, p auth.Principal, id string, policy netpol.Policy) (store.Sandbox, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return sb, err
	}
	return m.setNetwork(ctx, sb, policy)
}

// Delete removes ended sandbox id's row now, as retention would later; a
// live one, or one an unfinished run names, is refused.
func (m *Manager) Delete(ctx context.Context, p auth.Principal, id string) error {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return err
	}
	return m.deleteEnded(ctx, sb)
}

// Exec runs a command in running sandbox id, streaming its output.
func (m *Manager) Exec(ctx context.Context, p auth.Principal, id string, req ExecRequest, stdout, stderr io.Writer) (ExecResult, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return ExecResult{}, err
	}
	return m.exec(ctx, sb, req, stdout, stderr)
}

// StatPath describes path (filecopy.Resolve's rules) in running sandbox id,
// which this node hosts, without following a final link; it returns the
// path resolved.
func (m *Manager) StatPath(ctx context.Context, p auth.Principal, id, path string) (string, filecopy.Entry, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return "", filecopy.Entry{}, err
	}
	return m.statPath(ctx, sb, path)
}

// ArchiveOut measures the archive of path in running sandbox id, which
// this node hosts (filecopy.Walk), refusing it past lim; its WriteTar
// sends it.
func (m *Manager) ArchiveOut(ctx context.Context, p auth.Principal, id, path string, lim filecopy.Limits) (*filecopy.Archive, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return m.archiveOut(ctx, sb, path, lim)
}

// ExtractIn writes the tar archive r into the directory dir of running
// sandbox id, which this node hosts (filecopy.Extract).
func (m *Manager) ExtractIn(ctx context.Context, p auth.Principal, id, dir string, r io.Reader, lim filecopy.Limits) (filecopy.Extracted, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return filecopy.Extracted{}, err
	}
	return m.extractIn(ctx, sb, dir, r, lim)
}

// AgentTransport carries requests to the guest agent of running sandbox
// id, which this node hosts, its workspace readied first as for an exec:
// for an API that speaks the agent's own protocol.
func (m *Manager) AgentTransport(ctx context.Context, p auth.Principal, id string) (http.RoundTripper, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return m.agentTransport(ctx, sb)
}

// CodeTarget is the way to running sandbox id's code interpreter (its
// agent, which this node reaches; a paused sandbox is woken), and who code
// runs as there: its commands' user, directory and environment (the
// sandbox's own and its template's, as an exec's).
func (m *Manager) CodeTarget(ctx context.Context, p auth.Principal, id string) (codeint.Target, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return codeint.Target{}, err
	}
	rsb, tr, err := m.agentOf(ctx, sb)
	if err != nil {
		return codeint.Target{}, err
	}
	cwd, user, err := m.ExecDefaults(ctx, sb)
	if err != nil {
		return codeint.Target{}, err
	}
	var env []string
	if h, ok := rsb.(runtime.EnvHolder); ok {
		env = h.ExecEnv()
	} else if env, err = m.TemplateEnv(ctx, sb); err != nil {
		return codeint.Target{}, err
	}
	return codeint.Target{Transport: tr, User: user, Dir: cwd, Env: env}, nil
}

// Stats measures running sandbox id, which this node hosts (a paused one
// is woken: callers that must not wake it check first).
func (m *Manager) Stats(ctx context.Context, p auth.Principal, id string) (runtime.Stats, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return runtime.Stats{}, err
	}
	return m.stats(ctx, sb)
}

// Traffic is what running sandbox id's network carried so far; nil when
// it has none, or is hosted elsewhere.
func (m *Manager) Traffic(ctx context.Context, p auth.Principal, id string) (*netpol.Traffic, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return m.TrafficOf(ctx, sb)
}

// Ports lists the TCP ports something listens on in running sandbox id.
func (m *Manager) Ports(ctx context.Context, p auth.Principal, id string) ([]int, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return m.ports(ctx, sb)
}

// Processes lists the processes started in running sandbox id (by exec
// and runs) that still run.
func (m *Manager) Processes(ctx context.Context, p auth.Principal, id string) ([]runtime.Process, error) {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return nil, err
	}
	return m.processes(ctx, sb)
}

// SignalProcess sends sig to process pid of running sandbox id and to
// everything it started.
func (m *Manager) SignalProcess(ctx context.Context, p auth.Principal, id string, pid int, sig syscall.Signal) error {
	sb, err := m.sandboxFor(ctx, p, id)
	if err != nil {
		return err
	}
	return m.signalProcess(ctx, sb, pid, sig)
}
