package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The concerns around a sandbox's life — its key, its network, the
// account's snapshot and what persistence adds to its environment — plug
// into the lifecycle as hooks, the way Nomad's task runner hooks do
// (TaskPrestartHook, TaskPoststartHook, TaskUpdateHook, TaskPreKillHook,
// TaskStopHook): the state machine calls each kind at its moment, and a
// concern is one type in its own place instead of lines woven into start
// and stop. The network is one of them (NetworkHook, network.go): the
// manager knows it only by the kinds it implements.
// `sandboxd serve` registers them (Config.Hooks), in order.

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

// PoststartHook sees a sandbox the runtime has started (rsb), before it is
// marked running; restored says the runtime took the spec's Layers (a
// restore that fails starts the sandbox fresh instead). A failure fails the
// start with the hook's reason. It must not block on long work: the create
// waits for it.
type PoststartHook interface {
	Hook
	Poststart(ctx context.Context, sb *store.Sandbox, rsb runtime.Sandbox, restored bool) error
	FailureReason() string
}

// PreKillHook acts at the moment a stop is decided, before the sandbox's
// node gets round to it (perhaps through a job on another node): what
// must end at once, like the sandbox's key.
type PreKillHook interface {
	Hook
	PreKill(ctx context.Context, id string) error
}

// StopHook undoes what its concern made for sandbox id, on every path on
// which a sandbox ends: stopped, failed to start, found gone. Idempotent.
type StopHook interface {
	Hook
	Stop(ctx context.Context, id string) error
}

// UpdateHook applies a change of a running sandbox's row to what its
// concern made for it, without restarting the sandbox, the way Nomad's
// TaskUpdateHook does. A new network policy (SetNetwork) is the change
// today: CheckUpdate may refuse it before the row records it (cur is the
// row as it is, next as it would be); then the row records it and Update
// applies it (sb is the new row), the row going back when one fails. Their
// errors are the caller's answer, in errdefs' classes.
type UpdateHook interface {
	Hook
	CheckUpdate(ctx context.Context, cur, next store.Sandbox) error
	Update(ctx context.Context, sb store.Sandbox) error
}

// RecoverHook sees each running sandbox Reconcile keeps after a restart,
// and makes what its concern made for it follow the row again: a crash can
// leave them apart (between an update's row and its Update, say).
type RecoverHook interface {
	Hook
	Recover(ctx context.Context, sb store.Sandbox) error
}

// NetworkOwner is the hook that gives sandboxes their networks
// (NetworkHook). Without one every sandbox has loopback only and a policy
// that needs a network is refused; with one, it answers what a sandbox's
// network carried and where the host reaches the sandbox.
type NetworkOwner interface {
	Hook
	// Traffic is what sandbox id's network carried so far; nil when it
	// has none.
	Traffic(id string) (*netpol.Traffic, error)
	// GuestAddr is the address the host reaches sandbox id's network at;
	// an error when it has none.
	GuestAddr(id string) (netip.Addr, error)
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

// poststart runs the poststart hooks in order; on a failure it returns the
// failing hook's reason.
func (m *Manager) poststart(ctx context.Context, sb *store.Sandbox, rsb runtime.Sandbox, restored bool) (reason string, err error) {
	for _, h := range m.hooks {
		if p, ok := h.(PoststartHook); ok {
			if err := p.Poststart(ctx, sb, rsb, restored); err != nil {
				return p.FailureReason(), fmt.Errorf("%s: %w", h.Name(), err)
			}
		}
	}
	return "", nil
}

// preKill runs every pre-kill hook for sandbox id, logging failures.
func (m *Manager) preKill(ctx context.Context, id string) {
	for _, h := range m.hooks {
		if k, ok := h.(PreKillHook); ok {
			if err := k.PreKill(ctx, id); err != nil {
				m.log.Error("pre-kill hook", "hook", h.Name(), "sandbox_id", id, "err", err)
			}
		}
	}
}

// ended runs every stop hook for sandbox id, logging failures; it reports
// them joined.
func (m *Manager) ended(ctx context.Context, id string) error {
	m.endTraffic(ctx, id)
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

// checkUpdate asks every update hook whether sandbox cur may become next.
func (m *Manager) checkUpdate(ctx context.Context, cur, next store.Sandbox) error {
	for _, h := range m.hooks {
		if u, ok := h.(UpdateHook); ok {
			if err := u.CheckUpdate(ctx, cur, next); err != nil {
				return err
			}
		}
	}
	return nil
}

// update runs the update hooks in order on sandbox sb's new row; the first
// failure stops them and is returned.
func (m *Manager) update(ctx context.Context, sb store.Sandbox) error {
	for _, h := range m.hooks {
		if u, ok := h.(UpdateHook); ok {
			if err := u.Update(ctx, sb); err != nil {
				return err
			}
		}
	}
	return nil
}

// recover runs every recover hook on a sandbox Reconcile keeps, logging
// failures.
func (m *Manager) recover(ctx context.Context, sb store.Sandbox) {
	for _, h := range m.hooks {
		if r, ok := h.(RecoverHook); ok {
			if err := r.Recover(ctx, sb); err != nil {
				m.log.Error("recover hook", "hook", h.Name(), "sandbox_id", sb.ID, "err", err)
			}
		}
	}
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

// KeyHookConfig configures the key hook.
type KeyHookConfig struct {
	Store *store.Store
	// Env is extra environment for every sandbox. Everything in it is
	// readable by every tenant: never an operator credential (GitHub
	// tokens and model keys stay on the host; see AnthropicProxy).
	Env map[string]string
	// AnthropicProxy points Claude Code in sandboxes at the Anthropic API
	// through the model proxy (ANTHROPIC_BASE_URL), with the sandbox's own
	// key as its ANTHROPIC_API_KEY: the proxy adds the real credential.
	AnthropicProxy bool
	Now            func() time.Time // default time.Now
}

// NewKeyHook returns the hook that mints each sandbox a key of its own
// (sandbox-scoped, in RECOUP_API_KEY) and revokes it the moment a stop is
// decided and again on every end. No operator credential enters the
// environment: the agent CLIs get the sandbox's key as their API key,
// which the model proxy swaps for the real one outside.
func NewKeyHook(c KeyHookConfig) Hook {
	if c.Now == nil {
		c.Now = time.Now
	}
	return keyHook(c)
}

type keyHook KeyHookConfig

func (keyHook) Name() string          { return "keys" }
func (keyHook) FailureReason() string { return "could not mint its API key" }

func (h keyHook) Prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	plaintext, prefix, hash, err := auth.NewKey()
	if err != nil {
		return err
	}
	key := store.APIKey{AccountID: sb.AccountID, Name: "sandbox " + sb.ID, Prefix: prefix, Hash: hash, SandboxID: sb.ID}
	if err := h.Store.CreateAPIKey(ctx, &key); err != nil {
		return fmt.Errorf("mint sandbox key: %w", err)
	}
	spec.Env = append(spec.Env,
		"RECOUP_ACCOUNT_ID="+sb.AccountID,
		"RECOUP_API_KEY="+plaintext,
		"SANDBOX_ID="+sb.ID,
		"SANDBOXD_URL=http://sandboxd.internal",
	)
	for k, v := range h.Env {
		if v != "" {
			spec.Env = append(spec.Env, k+"="+v)
		}
	}
	if h.AnthropicProxy {
		spec.Env = append(spec.Env, "ANTHROPIC_BASE_URL="+modelproxy.SandboxURL+"anthropic", "ANTHROPIC_API_KEY="+plaintext)
	}
	return nil
}

// PreKill revokes the key with the stop decision: code inside cannot use
// it while the stop is on its way.
func (h keyHook) PreKill(ctx context.Context, id string) error { return h.Stop(ctx, id) }

// Stop revokes the sandbox's keys: every path on which a sandbox ends goes
// through the stop hooks.
func (h keyHook) Stop(ctx context.Context, id string) error {
	if err := h.Store.RevokeSandboxKeys(ctx, id, h.Now()); err != nil {
		return fmt.Errorf("revoke keys of sandbox %s: %w", id, err)
	}
	return nil
}
