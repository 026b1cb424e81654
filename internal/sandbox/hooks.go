package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The concerns around a sandbox's life — its key, its network, what
// persistence adds to its environment — plug into the lifecycle as hooks,
// the way Nomad's task runner hooks do (TaskPrestartHook, TaskStopHook,
// ...): the state machine calls each kind at its moment, and a concern is
// one type in its own place instead of lines woven into start and stop.

// Hook is one concern; it implements any of the hook kinds below.
type Hook interface {
	// Name says which concern failed, in logs.
	Name() string
}

// PrestartHook adds what its concern gives the sandbox to the spec the
// runtime creates it from (environment, network, ...). A failure fails the
// start with the hook's reason; the stop hooks then undo what was made.
type PrestartHook interface {
	Hook
	Prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) error
	// FailureReason is the sandbox's failure reason when Prestart fails.
	FailureReason() string
}

// StopHook undoes what its concern made for sandbox id, on every path on
// which a sandbox ends: stopped, failed to start, found gone. Idempotent.
type StopHook interface {
	Hook
	Stop(ctx context.Context, id string) error
}

// ReconcileHook removes what its concern left for sandboxes that are gone
// (a crash leaves things behind); keep says which ids are alive.
type ReconcileHook interface {
	Hook
	Reconcile(ctx context.Context, keep func(id string) bool) error
}

// prestart runs the prestart hooks in order; on a failure it returns the
// failing hook's reason.
func (m *Manager) prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) (reason string, err error) {
	for _, h := range m.hooks {
		if p, ok := h.(PrestartHook); ok {
			if err := p.Prestart(ctx, sb, spec); err != nil {
				return p.FailureReason(), fmt.Errorf("%s: %w", h.Name(), err)
			}
		}
	}
	return "", nil
}

// ended runs every stop hook for sandbox id, logging failures; it reports
// them joined.
func (m *Manager) ended(ctx context.Context, id string) error {
	var errs []error
	for _, h := range m.hooks {
		if s, ok := h.(StopHook); ok {
			if err := s.Stop(ctx, id); err != nil {
				m.log.Error("stop hook", "hook", h.Name(), "sandbox_id", id, "err", err)
				errs = append(errs, fmt.Errorf("%s: %w", h.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// reconcileHooks runs every reconcile hook.
func (m *Manager) reconcileHooks(ctx context.Context, keep func(id string) bool) {
	for _, h := range m.hooks {
		if r, ok := h.(ReconcileHook); ok {
			if err := r.Reconcile(ctx, keep); err != nil {
				m.log.Error("reconcile hook", "hook", h.Name(), "err", err)
			}
		}
	}
}

// keyHook mints each sandbox a key of its own (sandbox-scoped, in
// RECOUP_API_KEY) and revokes it when the sandbox ends. No operator
// credential enters the environment: the agent CLIs get the sandbox's key
// as their API key, which the model proxy swaps for the real one outside.
type keyHook struct {
	st       *store.Store
	settings *Settings
	now      func() time.Time
}

func (keyHook) Name() string          { return "keys" }
func (keyHook) FailureReason() string { return "could not mint its API key" }

func (h keyHook) Prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	plaintext, prefix, hash, err := auth.NewKey()
	if err != nil {
		return err
	}
	key := store.APIKey{AccountID: sb.AccountID, Name: "sandbox " + sb.ID, Prefix: prefix, Hash: hash, SandboxID: sb.ID}
	if err := h.st.CreateAPIKey(ctx, &key); err != nil {
		return fmt.Errorf("mint sandbox key: %w", err)
	}
	spec.Env = append(spec.Env,
		"RECOUP_ACCOUNT_ID="+sb.AccountID,
		"RECOUP_API_KEY="+plaintext,
		"SANDBOX_ID="+sb.ID,
		"SANDBOXD_URL=http://sandboxd.internal",
	)
	for k, v := range h.settings.Env {
		if v != "" {
			spec.Env = append(spec.Env, k+"="+v)
		}
	}
	if h.settings.AnthropicProxy {
		spec.Env = append(spec.Env, "ANTHROPIC_BASE_URL="+modelproxy.SandboxURL+"anthropic", "ANTHROPIC_API_KEY="+plaintext)
	}
	return nil
}

// Stop revokes the sandbox's keys: every path on which a sandbox ends goes
// through the stop hooks (and the stop decision revokes at once, too).
func (h keyHook) Stop(ctx context.Context, id string) error {
	if err := h.st.RevokeSandboxKeys(ctx, id, h.now()); err != nil {
		return fmt.Errorf("revoke keys of sandbox %s: %w", id, err)
	}
	return nil
}

// networkHook gives a sandbox whose policy needs one its network namespace
// (netpol), and removes it when the sandbox ends or is found gone.
type networkHook struct{ net *netpol.Manager }

func (networkHook) Name() string          { return "network" }
func (networkHook) FailureReason() string { return "could not set up its network" }

func (h networkHook) Prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	policy, err := sandboxPolicy(sb)
	if err != nil || !hasNetwork(policy) {
		return err
	}
	n, err := h.net.Setup(ctx, sb.ID, policy)
	if err != nil {
		return err
	}
	spec.Network = &runtime.Network{Netns: n.Netns, Nameservers: n.Nameservers()}
	return nil
}

func (h networkHook) Stop(ctx context.Context, id string) error { return h.net.Teardown(ctx, id) }

func (h networkHook) Reconcile(ctx context.Context, keep func(id string) bool) error {
	return h.net.Reconcile(ctx, keep)
}

// persistEnvHook adds what persistence needs in the environment (git's
// credentials for the account's repository).
type persistEnvHook struct{ p Persistence }

func (persistEnvHook) Name() string          { return "persistence" }
func (persistEnvHook) FailureReason() string { return "could not prepare its persistence" }

func (h persistEnvHook) Prestart(_ context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	spec.Env = append(spec.Env, h.p.Env(sb)...)
	return nil
}
