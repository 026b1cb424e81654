package persist

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Hooks are persistence's concerns in a sandbox's life (see sandbox.Hook),
// for `sandboxd serve` to register: git's credentials in the environment,
// the account's snapshot as the layers the sandbox starts from, and its
// /workspace readied as soon as it runs.
func (s *Service) Hooks() []sandbox.Hook {
	return []sandbox.Hook{envHook{}, &layersHook{s: s, held: map[string]heldLayers{}}, workspaceHook{s: s}}
}

// workspaceHook readies /workspace (Prepare) once the runtime has started
// the sandbox. The fast ways (fastPrepare: an archive the agent unpacks,
// or a restored clone already at main) take tens of milliseconds, and the
// create waits for them, so that a sandbox that says running runs its
// first command at once. The script, when one is needed, runs in the
// background: the create answers without it, and runs and execs wait for
// it through Prepare.
type workspaceHook struct{ s *Service }

// fastPrepareTimeout bounds what a create waits for its workspace (the
// archives are of repositories of at most maxFastClone). An unpack cut
// off by it is logged, as a failed script is, and the sandbox runs with
// what was written.
const fastPrepareTimeout = 30 * time.Second

func (workspaceHook) Name() string          { return "workspace" }
func (workspaceHook) FailureReason() string { return "could not prepare its workspace" }

func (h workspaceHook) Poststart(ctx context.Context, sb *store.Sandbox, rsb runtime.Sandbox, _ bool) error {
	row := *sb
	if row.ForkedFrom != "" || row.Pause == store.PauseResuming {
		// A fork's /workspace is its parent's as it was, prepared
		// before the fork, and a sandbox resumed from its saved files
		// has its own as it was at the pause: doing it again would
		// change them.
		h.s.markPrepared(row.ID)
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	// The memo entry is made here, not in the goroutine: a start that
	// fails right after runs the stop hook, which must find it to forget
	// it (made later, it would stay for good).
	p := h.s.preparation(row.ID)
	fctx, cancel := context.WithTimeout(ctx, fastPrepareTimeout)
	fast := h.s.prepareFast(fctx, p, row, rsb)
	cancel()
	if fast {
		return nil
	}
	go func() { _ = h.s.prepareOnce(ctx, p, row, rsb, false) }()
	return nil
}

func (h workspaceHook) Stop(_ context.Context, id string) error {
	h.s.forgetPrepared(id)
	return nil
}

// envHook adds git's credential helper for the account's repository.
type envHook struct{}

func (envHook) Name() string          { return "persistence" }
func (envHook) FailureReason() string { return "could not prepare its persistence" }

func (envHook) Prestart(_ context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	spec.Env = append(spec.Env, GitEnv(sb.ID)...)
	return nil
}

// layersHook starts a sandbox from its account's snapshot: prestart opens
// the chain of layers into the spec, poststart closes them and records on
// the row which snapshot the sandbox started from (when the runtime took
// them; a failed restore starts fresh), and the stop hook closes what a
// start that failed in between left open.
type layersHook struct {
	s    *Service
	mu   sync.Mutex
	held map[string]heldLayers // sandbox id -> the layers opened for it
}

type heldLayers struct {
	snapshotID string
	release    func()
}

func (*layersHook) Name() string          { return "snapshot" }
func (*layersHook) FailureReason() string { return "could not record the snapshot it started from" }

func (h *layersHook) Prestart(ctx context.Context, sb store.Sandbox, spec *runtime.Spec) error {
	if sb.ForkedFrom != "" {
		return nil // its filesystem is its parent's, not the snapshot's
	}
	if sb.TemplateID != "" {
		// The account's snapshot is a layer over the built-in image: a
		// sandbox from a custom template never starts from it.
		return nil
	}
	layers, snapID, release, err := h.s.Layers(ctx, sb.AccountID)
	if err != nil {
		// A snapshot that cannot be opened must not lock the account out.
		h.s.log.Warn("open account snapshot; starting fresh", "sandbox_id", sb.ID, "account_id", sb.AccountID, "err", err)
		return nil
	}
	if len(layers) == 0 {
		release()
		return nil
	}
	h.mu.Lock()
	h.held[sb.ID] = heldLayers{snapshotID: snapID, release: release}
	h.mu.Unlock()
	spec.Layers = layers
	return nil
}

func (h *layersHook) Poststart(ctx context.Context, sb *store.Sandbox, _ runtime.Sandbox, restored bool) error {
	held, ok := h.take(sb.ID)
	if !ok {
		return nil
	}
	held.release()
	if !restored {
		return nil
	}
	if err := h.s.st.SetSandboxSnapshot(ctx, sb.ID, held.snapshotID); err != nil {
		return fmt.Errorf("record snapshot of %s: %w", sb.ID, err)
	}
	sb.SnapshotID = held.snapshotID
	return nil
}

func (h *layersHook) Stop(_ context.Context, id string) error {
	if held, ok := h.take(id); ok {
		held.release()
	}
	return nil
}

func (h *layersHook) take(id string) (heldLayers, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	held, ok := h.held[id]
	delete(h.held, id)
	return held, ok
}
