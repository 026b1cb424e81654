// Package sandbox owns the lifecycle of sandboxes: the state machine
// (pending → running → stopping → stopped, any → failed), placement on this
// node's runtime, deadlines and the reaper, the background runs executed in
// sandboxes, and reconciliation after a restart.
//
// Invariants: every transition is a database update first (compare-and-set
// on the status), then the action; a sandbox row names the node that hosts
// it, and only that node touches its runtime sandbox — other nodes ask it
// through a job on its queue. On start, Reconcile makes the database and the
// runtime agree before anything else runs.
package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/volumes"
)

// Settings are the operator's limits and defaults.
type Settings struct {
	DefaultTimeout time.Duration // lifetime when the request names none (10 min)
	MaxTimeout     time.Duration // longest lifetime a request may ask for
	PerAccount     int           // concurrent sandboxes per account, its tasks' included
	// SetupOnFirstUse runs the setup-sandbox task for an account the first
	// time it creates a sandbox.
	SetupOnFirstUse bool
	NodeCapacity    int // concurrent sandboxes on this node
	Limits          runtime.Limits
	// DiskReserveBytes of the data directory's filesystem are never
	// promised to sandboxes: the database, repositories, snapshots and
	// logs live there too (see admitDisk).
	DiskReserveBytes int64
	// MaxPaused bounds how long a sandbox may stay paused (0: no bound):
	// its deadline does not run meanwhile and its saved memory holds the
	// node's disk, so past it the sandbox is stopped and what it saved
	// deleted (reapPaused).
	MaxPaused time.Duration
	// UsageEvery is how often running sandboxes' resource use is measured
	// for their history (usage.go; 0: DefaultUsageEvery).
	UsageEvery time.Duration
	// WarmSandboxes the runtime's warm pool keeps started ahead, each
	// with a disk of Limits.DiskBytes that admitDisk counts as promised
	// (prewarmed sandboxes are counted as they exist).
	WarmSandboxes int
	// WarmPoolMax is what the warm pool may grow to when creates come
	// faster (warmpool.go); at most WarmSandboxes: a fixed size.
	WarmPoolMax int
	// TemplatePool is how many sandboxes of custom templates are kept
	// started ahead on this node, over all templates (tplpool.go; 0:
	// none). Each counts as a warm sandbox.
	TemplatePool int
	// Model is the provider OpenCode is pointed at for prompts, through
	// the model proxy on sandboxd.internal.
	Model runs.ModelProvider
	// Commands says which agent CLIs (opencode, claude) the base image
	// has, so that a request needing one the image lacks is refused at
	// once instead of failing later; nil checks nothing.
	Commands map[string]bool
	// Image names the base image in those refusals ("template base").
	Image string
	// Network is the policy of sandboxes whose request names none, and of
	// the sandboxes of the service's own tasks.
	Network netpol.Policy
}

// Persistence carries a sandbox's work between sandboxes: the account's
// snapshot layer to start from, the workspace, and what happens after a run
// (commit, push, snapshot). It is optional; without it sandboxes start
// fresh and keep nothing.
type Persistence interface {
	// Prepare readies /workspace in a started sandbox, once or again;
	// idempotent.
	Prepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, again bool) error
	// AfterRun persists the work of a run.
	AfterRun(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, run store.Run) (runs.Saved, error)
	// Snapshot captures the sandbox's filesystem as the account's snapshot.
	Snapshot(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) (snapshotID string, err error)
	// Initialize gives an account's empty repository a first commit.
	Initialize(ctx context.Context, account store.Account) error
	// DeleteAccount removes the account's environment row, snapshots (rows
	// and blobs) and repository.
	DeleteAccount(ctx context.Context, accountID string) error
}

// Config builds a Manager.
type Config struct {
	Store    *store.Store
	Runtime  runtime.Runtime
	Jobs     *jobs.Client
	NodeID   string
	DataDir  string
	BaseDir  string // read-only root filesystem of the base image
	BaseID   string // its image id
	Home     string // unix socket of this server, reachable as sandboxd.internal
	Settings Settings
	Persist  Persistence
	// Access is the one access rule the entry points by id load a sandbox
	// under (byid.go); nil: auth.NewAuthenticator over Store, the same rule.
	Access Access
	// Hooks are the concerns plugged into every sandbox's life, in order
	// (hooks.go): its key (NewKeyHook), its network (NewNetworkHook;
	// without it every sandbox has loopback only), persistence's.
	Hooks  []Hook
	Logger *slog.Logger

	// LogMaxBytes caps each run's log file (head and tail are kept);
	// 0: caplog.DefaultSize.
	LogMaxBytes int64

	// Templates finds the templates sandboxes start from
	// (internal/templates); nil: a request for one is refused.
	Templates Templates

	// Setups is the account setup task (internal/agents' Setups); nil:
	// no setup on first use, and runs wait for none.
	Setups Setups

	// Volumes resolves a create's volumes (internal/volumes; also one of
	// Hooks, which mounts them); nil: a create with volumes is refused.
	Volumes *volumes.Service

	// Blobs, with MovePauses, holds the saved state of memory pauses, so
	// that another node resumes them once theirs is gone (pausemove.go).
	Blobs blob.Store
	// MovePauses: this node is one of a cluster's, whose nodes share
	// Blobs: a pause with the memory saves the sandbox's state there too
	// when the runtime can move it (runtime.Mover).
	MovePauses bool
}

// Manager drives the sandboxes of one node: the service behind the API's
// sandbox routes.
type Manager struct {
	cfg    Config
	st     *store.Store
	access Access
	rt     runtime.Runtime
	log    *slog.Logger
	now    func() time.Time

	// stopping dedups concurrent stops of one sandbox on this node
	// (under mu).
	mu       sync.Mutex
	stopping map[string]chan struct{}
	// runs executes this node's run-sandbox-command runs.
	runs *runs.Runner
	// hooks are Config.Hooks; network is the one among them that owns
	// sandbox networks (nil: none).
	hooks   []Hook
	network NetworkOwner
	// traffic sums the ended sandboxes' network bytes (NetworkMetrics).
	traffic trafficMeter
	// netMu makes policy changes take turns, so that the row and the
	// host's rules of a sandbox end up with the same (last) policy.
	netMu sync.Mutex
	// diskMu serialises disk admission with the row's insert (admitDisk);
	// diskFreeFn measures free space (a field so tests can shrink a disk);
	// saving is what the saves of memory under way on this node have
	// reserved of its disk (admitSave), under diskMu.
	diskMu     sync.Mutex
	diskFreeFn func(dir string) (int64, error)
	saving     int64
	// ops counts the creates, pauses and forks (Metrics).
	ops *opMetrics
	// execDefaults caches ExecDefaults by template id.
	execDefaults sync.Map
	// tplPools sizes the custom templates' pools (tplpool.go).
	tplPools templatePools
	// warm sizes the built-in warm pool (warmpool.go).
	warm warmDemand
	// prewarmDemand sizes what is started ahead per account (prewarm.go).
	prewarmDemand prewarmDemand
	// filesSaver saves the files of a pause of the files alone; filesPausing
	// names the sandboxes such a pause is saving on this node, which
	// CaptureFiles reaches while their row says pausing (pausefiles.go).
	filesSaver   FilesSaver
	filesPausing sync.Map
	// usage is the running sandboxes' measures over time (usage.go).
	usage usageHistory
}

// NewManager returns a Manager. Call Reconcile before serving.
func NewManager(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &cfg.Settings
	if s.DefaultTimeout <= 0 {
		s.DefaultTimeout = 10 * time.Minute
	}
	if s.MaxTimeout <= 0 {
		s.MaxTimeout = 24 * time.Hour
	}
	if s.DefaultTimeout > s.MaxTimeout {
		s.DefaultTimeout = s.MaxTimeout
	}
	if s.Network.Mode == "" {
		s.Network = netpol.Policy{Mode: netpol.ModeNone}
	}
	m := &Manager{
		cfg: cfg, st: cfg.Store, rt: cfg.Runtime, log: cfg.Logger, now: time.Now,
		access:     cfg.Access,
		stopping:   map[string]chan struct{}{},
		diskFreeFn: diskFree,
		ops:        newOpMetrics(),
	}
	if m.access == nil {
		m.access = auth.NewAuthenticator(cfg.Store)
	}
	var persist runs.AfterRunner
	if cfg.Persist != nil {
		persist = prewarmAfterRun{cfg.Persist, m}
	}
	m.hooks = cfg.Hooks
	for _, h := range cfg.Hooks {
		if n, ok := h.(NetworkOwner); ok {
			m.network = n
		}
	}
	m.runs = runs.New(runs.Config{
		Store: cfg.Store, Jobs: cfg.Jobs, Host: m, Persist: persist, NodeID: cfg.NodeID,
		DataDir: cfg.DataDir, LogMaxBytes: cfg.LogMaxBytes, Model: cfg.Settings.Model,
		Logger: cfg.Logger.With("component", "runs"), Now: func() time.Time { return m.now() },
	})
	return m
}

// RequireCommand refuses (400) a request for what when the base image lacks
// the CLI name, naming the template that has it.
func (m *Manager) RequireCommand(name, what string) error {
	have := m.cfg.Settings.Commands
	if have == nil || have[name] {
		return nil
	}
	msg := fmt.Sprintf("%s needs the %s CLI, which this server's image (%s) does not have", what, name, m.cfg.Settings.Image)
	if t := image.TemplateWith(name); t != "" {
		msg += fmt.Sprintf("; start sandboxd serve with --template %s", t)
	}
	return errdefs.New(errdefs.ErrInvalid, msg)
}

// requireModel refuses (400) a prompt on a server with no model for
// OpenCode: without one, opencode starts, looks for a provider it cannot
// reach and gives up a minute and a half later, with a run that tells
// nothing useful. The refusal names the flags that configure one.
func (m *Manager) requireModel() error {
	mp := m.cfg.Settings.Model
	var missing []string
	if mp.BaseURL == "" {
		missing = append(missing, "--model-base-url URL")
	}
	if mp.Model == "" {
		missing = append(missing, "--model NAME")
	}
	if len(missing) == 0 {
		return nil
	}
	return errdefs.Newf(errdefs.ErrInvalid, "a prompt needs a model, and this server has none configured: start sandboxd serve with %s (any OpenAI-compatible API; add --model-api-key KEY when it needs one)",
		strings.Join(missing, " and "))
}

// promptArgs are opencode's arguments for a prompt: one argument, never
// through a shell, so the prompt arrives as typed. A prompt that starts
// with "-" follows "--", so that it is not read as an option.
func promptArgs(prompt string) []string {
	if strings.HasPrefix(prompt, "-") {
		return []string{"run", "--", prompt}
	}
	return []string{"run", prompt}
}

// activeStatuses are the statuses in which a sandbox holds resources.
var activeStatuses = []store.SandboxStatus{store.SandboxPending, store.SandboxRunning, store.SandboxStopping}

// Create places a sandbox for account and, with a command or prompt,
// starts a run in it; the row's status is true when returned.
func (m *Manager) Create(ctx context.Context, accountID string, req CreateRequest) (store.Sandbox, string, error) {
	if req.Prompt != "" {
		if err := m.RequireCommand("opencode", "a prompt"); err != nil {
			return store.Sandbox{}, "", err
		}
		if err := m.requireModel(); err != nil {
			return store.Sandbox{}, "", err
		}
	}
	lifetime := m.cfg.Settings.DefaultTimeout
	if req.Lifetime > 0 {
		lifetime = req.Lifetime
		if lifetime > m.cfg.Settings.MaxTimeout {
			return store.Sandbox{}, "", errdefs.Newf(errdefs.ErrInvalid, "timeout must be at most %d ms", m.cfg.Settings.MaxTimeout.Milliseconds())
		}
	}
	policy := m.cfg.Settings.Network
	if req.Network != nil {
		policy = *req.Network
	}
	switch req.OnTimeout {
	case "":
	case store.OnTimeoutPause:
		if _, err := m.pauser(); err != nil {
			return store.Sandbox{}, "", err
		}
	case store.OnTimeoutPauseFiles:
		if err := m.canPauseFiles(store.Sandbox{}); err != nil {
			return store.Sandbox{}, "", err
		}
	default:
		return store.Sandbox{}, "", errdefs.Newf(errdefs.ErrInvalid, "on timeout %q: want %s, %s or nothing", req.OnTimeout, store.OnTimeoutPause, store.OnTimeoutPauseFiles)
	}
	templateID, err := m.template(ctx, accountID, req.Template, req.Snapshot)
	if err != nil {
		return store.Sandbox{}, "", err
	}
	vols, err := m.volumes(ctx, accountID, req.Volumes)
	if err != nil {
		return store.Sandbox{}, "", err
	}
	sb, _, err := m.launch(ctx, accountID, "", lifetime, 0, policy, req.OnTimeout, templateID, vols...)
	if err != nil {
		return sb, "", err
	}
	ctx = context.WithoutCancel(ctx)
	if m.cfg.Settings.SetupOnFirstUse && m.cfg.Setups != nil {
		if err := m.cfg.Setups.IfNew(ctx, accountID); err != nil {
			m.log.Error("enqueue account setup", "account_id", accountID, "err", err)
		}
	}
	command, args := req.Command, req.Args
	if req.Prompt != "" {
		command, args = "opencode", promptArgs(req.Prompt)
	}
	if command == "" {
		return sb, "", nil
	}
	runID, err := runs.Enqueue(ctx, m.st, m.cfg.Jobs, sb, command, args, req.Cwd, m.now())
	if err != nil {
		m.StopQuietly(ctx, sb, "failed to start its run")
		return sb, "", err
	}
	return sb, runID, nil
}

// Launch records and starts a sandbox for account's task (the row names
// it: store.Sandbox.Task). Every sandbox counts against the account's
// quota, those the service starts for the account's tasks too; extra
// raises the account's limit for this one (setup gets one place beyond it,
// so that a user who is at the quota still gets set up).
func (m *Manager) Launch(ctx context.Context, accountID, task string, lifetime time.Duration, extra int, policy netpol.Policy) (store.Sandbox, runtime.Sandbox, error) {
	return m.launch(ctx, accountID, task, lifetime, extra, policy, "", "")
}

// volumes resolves a create's volume mounts into the new sandbox's
// attachments; a server without volumes refuses any.
func (m *Manager) volumes(ctx context.Context, accountID string, mounts []volumes.Mount) ([]store.VolumeAttachment, error) {
	if len(mounts) == 0 {
		return nil, nil
	}
	if m.cfg.Volumes == nil {
		return nil, errdefs.New(errdefs.ErrInvalid, "volumes are not enabled on this server")
	}
	return m.cfg.Volumes.Resolve(ctx, accountID, mounts)
}

// launch is Launch of a sandbox whose deadline does onTimeout; task is ""
// for a sandbox the account asked for, templateID "" for one of the
// built-in image; vols are the volumes it mounts (their leases are taken
// with its row, or the create refused with 409).
func (m *Manager) launch(ctx context.Context, accountID, task string, lifetime time.Duration, extra int, policy netpol.Policy, onTimeout, templateID string, vols ...store.VolumeAttachment) (_ store.Sandbox, _ runtime.Sandbox, err error) {
	defer func(start time.Time) { m.ops.observe(opCreate, start, err) }(time.Now())
	if hasNetwork(policy) && !m.rt.Capabilities().Network {
		return store.Sandbox{}, nil, errdefs.Newf(errdefs.ErrInvalid, `the %s runtime of this server does not support sandbox networks yet; create the sandbox with network "none"`, m.rt.Name())
	}
	if hasNetwork(policy) && m.network == nil {
		return store.Sandbox{}, nil, errdefs.New(errdefs.ErrInvalid, `networking is not enabled on this server; create the sandbox with network "none"`)
	}
	network, err := json.Marshal(policy)
	if err != nil {
		return store.Sandbox{}, nil, err
	}
	now := m.now()
	sb := store.Sandbox{
		ID: store.NewID("sbx_"), AccountID: accountID, NodeID: m.cfg.NodeID,
		Status: store.SandboxPending, Runtime: m.rt.Name(), Network: string(network),
		CreatedAt: now, UpdatedAt: now, Deadline: now.Add(lifetime), OnTimeout: onTimeout, Task: task,
		TemplateID: templateID, Volumes: vols,
	}
	release, err := m.admitDisk(ctx, 1)
	if err != nil {
		return store.Sandbox{}, nil, err
	}
	// Count and insert in one locked transaction: simultaneous creates
	// cannot all see the same free place.
	err = m.st.CreateSandboxWithin(ctx, &sb, m.sandboxLimits(extra))
	release()
	if err != nil {
		return store.Sandbox{}, nil, quotaError(err)
	}
	// From here on the row exists: finish what was started even if the
	// caller goes away, so no row is left pending by a dropped request.
	rsb, err := m.start(context.WithoutCancel(ctx), &sb)
	return sb, rsb, err
}

// sandboxLimits are the limits a new sandbox is checked against; extra
// raises the account's (a zero, unlimited, quota stays unlimited).
func (m *Manager) sandboxLimits(extra int) store.SandboxLimits {
	lim := store.SandboxLimits{PerAccount: m.cfg.Settings.PerAccount, PerNode: m.cfg.Settings.NodeCapacity}
	if lim.PerAccount > 0 {
		lim.PerAccount += extra
	}
	return lim
}

// quotaError turns the store's quota errors into the API's (429, with the
// figures); other errors keep their cause.
func quotaError(err error) error {
	var qe *store.QuotaError
	var busy *store.VolumeBusyError
	if errors.As(err, &busy) {
		return errdefs.New(errdefs.ErrConflict, busy.Error())
	}
	if !errors.As(err, &qe) {
		return fmt.Errorf("record sandbox: %w", err)
	}
	switch qe.Scope {
	case "account":
		return errdefs.Newf(errdefs.ErrQuota, "account has %d active sandboxes (its tasks' included), the limit is %d; stop one first", qe.Count, qe.Limit)
	case "node":
		return errdefs.Newf(errdefs.ErrQuota, "the server is at capacity (%d sandboxes); try again later", qe.Limit)
	default:
		return errdefs.New(errdefs.ErrQuota, qe.Error())
	}
}

// start places a pending sandbox on the runtime and marks it running, or
// failed with a reason for its user (reasons.go); the error, for the log,
// says more.
func (m *Manager) start(ctx context.Context, sb *store.Sandbox) (runtime.Sandbox, error) {
	fail := func(reason string, err error) (runtime.Sandbox, error) {
		m.markFailed(ctx, sb.ID, []store.SandboxStatus{store.SandboxPending}, reason)
		sb.Status, sb.FailureReason = store.SandboxFailed, reason
		return nil, fmt.Errorf("start sandbox %s: %s: %w", sb.ID, reason, err)
	}
	rsb, spec, restored, reason, err := m.place(ctx, sb, "could not open its template")
	if err != nil {
		return fail(reason, err)
	}
	ok, err := m.st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxPending}, store.SandboxRunning, "", m.now())
	if err != nil || !ok {
		_ = rsb.Destroy(ctx)
		if err == nil {
			err = errors.New("sandbox left pending while starting")
		}
		return fail(reasonStateChanged, err)
	}
	sb.Status, sb.UpdatedAt = store.SandboxRunning, m.now()
	if sb.TemplateID != "" && spec.Network == nil {
		// Its template is in demand: its pool is sized (and filled)
		// for the next creates.
		m.templateCreated(sb.TemplateID)
	}
	if sb.TemplateID == "" && spec.Network == nil && len(spec.Layers) == 0 && sb.ForkedFrom == "" {
		// A create the built-in warm pool serves: it is sized for the
		// next ones.
		m.warmCreated()
	}
	if restored {
		// The account is active: its next creates find sandboxes started
		// ahead too, as many as its recent creates ask for.
		m.prewarmCreated(sb.AccountID)
		m.Prewarm(sb.AccountID)
	}
	m.log.Info("sandbox running", "sandbox_id", sb.ID, "account_id", sb.AccountID, "runtime", rsb.Info().Backend, "snapshot_id", sb.SnapshotID)
	return rsb, nil
}

// place puts sb on the runtime: its spec (its template's files, when it
// has one; openFailure is the reason when they cannot be opened), what the
// prestart hooks add, the runtime's create, the poststart hooks and its
// template's start command. It answers the spec, whether the runtime took
// its layers, or the user's reason for a failure, after which nothing of
// the runtime sandbox is left. The row's status is the caller's.
func (m *Manager) place(ctx context.Context, sb *store.Sandbox, openFailure string) (_ runtime.Sandbox, spec runtime.Spec, restored bool, reason string, err error) {
	return m.placeFrom(ctx, sb, openFailure, "")
}

// placeFrom is place, or, with moved (a paused sandbox's state saved by
// runtime.Mover), the restore of that state: its processes carry on, so
// its template's start command does not run again, and the layers the
// hooks would restore are in its saved writable layer already.
func (m *Manager) placeFrom(ctx context.Context, sb *store.Sandbox, openFailure, moved string) (_ runtime.Sandbox, spec runtime.Spec, restored bool, reason string, err error) {
	spec = m.baseSpec(*sb)
	img, release, err := m.fromTemplate(ctx, *sb, &spec)
	if err != nil {
		return nil, spec, false, errdefs.Message(err, openFailure), err
	}
	defer release()
	if reason, err := m.prestart(ctx, *sb, &spec); err != nil {
		return nil, spec, false, reason, err
	}
	var rsb runtime.Sandbox
	if moved != "" {
		closeLayers(spec.Layers)
		spec.Layers = nil
		mv, _ := m.rt.(runtime.Mover)
		if mv == nil {
			return nil, spec, false, reasonStartGeneric, fmt.Errorf("the %s runtime cannot restore a moved sandbox", m.rt.Name())
		}
		rsb, err = mv.RestoreMoved(ctx, spec, moved)
	} else {
		rsb, restored, err = m.create(ctx, sb, spec)
	}
	if err != nil {
		return nil, spec, false, startFailure(err, reasonStartGeneric), err
	}
	if reason, err := m.poststart(ctx, sb, rsb, restored); err != nil {
		_ = rsb.Destroy(ctx)
		return nil, spec, false, reason, err
	}
	if moved == "" {
		if reason, err := m.startTemplate(ctx, rsb, img); err != nil {
			_ = rsb.Destroy(ctx)
			return nil, spec, false, reason, err
		}
	}
	return rsb, spec, restored, "", nil
}

// closeLayers closes the layer streams a spec will not restore.
func closeLayers(layers []runtime.Layer) {
	for _, l := range layers {
		if c, ok := l.R.(io.Closer); ok {
			_ = c.Close()
		}
	}
}

// Prepare readies the sandbox's workspace (persistence's, which remembers
// it was done): once, or again when asked, to pick up what was pushed
// since. Without persistence there is nothing to ready.
func (m *Manager) Prepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, again bool) error {
	if m.cfg.Persist == nil {
		return nil
	}
	return m.cfg.Persist.Prepare(ctx, sb, rsb, again)
}

// create starts the sandbox on the runtime. A restore of the spec's
// layers (the account's snapshot, added by a prestart hook) that fails
// starts the sandbox fresh instead: a broken snapshot must not lock the
// account out. restored says the layers were taken.
func (m *Manager) create(ctx context.Context, sb *store.Sandbox, spec runtime.Spec) (rsb runtime.Sandbox, restored bool, err error) {
	rsb, err = m.rt.Create(ctx, spec)
	if sb.TemplateID != "" {
		// Its layers are its template's, not the account's snapshot: a
		// sandbox without them would not be of its template.
		return rsb, false, err
	}
	if err == nil || len(spec.Layers) == 0 {
		return rsb, err == nil && len(spec.Layers) > 0, err
	}
	m.log.Warn("restore account snapshot; starting fresh", "sandbox_id", sb.ID, "account_id", sb.AccountID, "err", err)
	spec.Layers = nil
	rsb, err = m.rt.Create(ctx, spec)
	return rsb, false, err
}

// Live refreshes rows with the status their hosts report. The database is the source of truth
// (the reaper and the stop path keep it current); rows of this node whose
// runtime sandbox vanished are corrected on the spot.
func (m *Manager) Live(ctx context.Context, sbs []store.Sandbox) []store.Sandbox {
	out := make([]store.Sandbox, len(sbs))
	var wg sync.WaitGroup
	for i, sb := range sbs {
		out[i] = sb
		if sb.Status != store.SandboxRunning || sb.NodeID != m.cfg.NodeID || sb.PausedFiles {
			continue
		}
		wg.Go(func() {
			if _, err := m.rt.Get(ctx, sb.ID); errors.Is(err, runtime.ErrNotFound) {
				reason := reasonExited
				if m.markFailed(context.WithoutCancel(ctx), sb.ID, []store.SandboxStatus{store.SandboxRunning}, reason) {
					out[i].Status, out[i].FailureReason = store.SandboxFailed, reason
				}
			}
		})
	}
	wg.Wait()
	return out
}

// exec runs a command in a running sandbox, streaming its output.
func (m *Manager) exec(ctx context.Context, sb store.Sandbox, req ExecRequest, stdout, stderr io.Writer) (ExecResult, error) {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return ExecResult{}, err
	}
	_ = m.Prepare(ctx, sb, rsb, false) // a failure is logged; the command may not need the clone
	env := make([]string, 0, len(req.Env))
	for k, v := range req.Env {
		env = append(env, k+"="+v)
	}
	timeout := time.Until(sb.Deadline)
	if req.Timeout > 0 {
		timeout = min(timeout, req.Timeout)
	}
	stdin := req.Input
	if stdin == nil && req.Stdin != "" {
		stdin = strings.NewReader(req.Stdin)
	}
	cwd, user, err := m.ExecDefaults(ctx, sb)
	if err != nil {
		return ExecResult{}, err
	}
	rreq := runtime.ExecRequest{
		Cmd: append([]string{req.Command}, req.Args...), Env: env, Cwd: cmp.Or(req.Cwd, cwd), User: user,
		Stdin: stdin, Stdout: stdout, Stderr: stderr, Timeout: timeout,
		Resize: req.Resize, Signal: req.Signal, Detach: req.Detach,
	}
	if req.PTY != nil {
		rreq.TTY, rreq.Rows, rreq.Cols = true, req.PTY.Rows, req.PTY.Cols
	}
	res, err := rsb.Exec(ctx, rreq)
	if err != nil {
		if errors.Is(err, runtime.ErrCommandNotFound) {
			return ExecResult{}, errdefs.Newf(errdefs.ErrInvalid, "command not found: %s", req.Command)
		}
		if errors.Is(err, runtime.ErrNotRunning) {
			// The sandbox died under the command (409, not a server error).
			return ExecResult{}, fmt.Errorf("exec in %s: %v: %w", sb.ID, err, errdefs.ErrNotRunning)
		}
		return ExecResult{}, fmt.Errorf("exec in %s: %w", sb.ID, err)
	}
	return ExecResult{ExitCode: res.ExitCode, OOMKilled: res.OOMKilled, TimedOut: res.TimedOut}, nil
}

// Local returns the runtime sandbox of a running sandbox of this node,
// resuming it first when it is paused.
func (m *Manager) Local(ctx context.Context, sb store.Sandbox) (runtime.Sandbox, error) {
	if sb.Status != store.SandboxRunning {
		return nil, errdefs.ErrNotRunning
	}
	if sb.NodeID != m.cfg.NodeID && !sb.FilesPaused() {
		return nil, fmt.Errorf("sandbox %s is hosted on node %s: %w", sb.ID, sb.NodeID, errdefs.ErrNotRunning)
	}
	if _, err := m.awake(ctx, sb); err != nil {
		return nil, err
	}
	rsb, err := m.rt.Get(ctx, sb.ID)
	if errors.Is(err, runtime.ErrNotFound) {
		return nil, errdefs.ErrNotRunning
	}
	if err != nil {
		return nil, fmt.Errorf("attach to sandbox %s: %w", sb.ID, err)
	}
	return rsb, nil
}

// agentTransport carries requests to the guest agent of a running sandbox
// this node hosts, its workspace readied first as for an exec (see
// runtime.Sandbox.AgentTransport): for an API that speaks the agent's own
// protocol.
func (m *Manager) agentTransport(ctx context.Context, sb store.Sandbox) (http.RoundTripper, error) {
	_, tr, err := m.agentOf(ctx, sb)
	return tr, err
}

// agentOf is sb's runtime sandbox, prepared, and the way to its agent.
func (m *Manager) agentOf(ctx context.Context, sb store.Sandbox) (runtime.Sandbox, http.RoundTripper, error) {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return nil, nil, err
	}
	_ = m.Prepare(ctx, sb, rsb, false) // a failure is logged; the caller may not need the clone
	tr, err := rsb.AgentTransport(ctx)
	return rsb, tr, err
}

// stats measures a running sandbox this node hosts (a paused one is woken:
// callers that must not wake it check first).
func (m *Manager) stats(ctx context.Context, sb store.Sandbox) (runtime.Stats, error) {
	rsb, err := m.Local(ctx, sb)
	if err != nil {
		return runtime.Stats{}, err
	}
	st, err := rsb.Stats(ctx)
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("measure sandbox %s: %w", sb.ID, err)
	}
	return st, nil
}

// stopByRequest stops a sandbox; stopping a stopped sandbox is not an error.
func (m *Manager) stopByRequest(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	if err := m.stop(context.WithoutCancel(ctx), sb, "stopped by request"); err != nil {
		return sb, err
	}
	return m.st.GetSandbox(ctx, sb.ID)
}

// stop moves a sandbox to stopping, and then — here if this node hosts it,
// else through a job on its node — destroys it and marks it stopped.
func (m *Manager) stop(ctx context.Context, sb store.Sandbox, reason string) error {
	// The reason is recorded now, so that a run cut short by the stop can
	// tell why (a timeout makes it FAILED with an error that says so).
	if _, err := m.st.TransitionSandbox(ctx, sb.ID, []store.SandboxStatus{store.SandboxPending, store.SandboxRunning}, store.SandboxStopping, reason, m.now()); err != nil {
		return fmt.Errorf("mark sandbox %s stopping: %w", sb.ID, err)
	}
	// A pause's state in the blob store goes with it.
	m.collectPausedState(ctx, sb.PausedState)
	// What must end with the decision (the key) ends now, not when the
	// node gets round to it.
	m.preKill(ctx, sb.ID)
	if sb.NodeID != m.cfg.NodeID {
		return m.cfg.Jobs.Insert(ctx, jobs.StopSandboxArgs{SandboxID: sb.ID, Reason: reason}, sb.NodeID)
	}
	return m.finishStop(ctx, sb.ID, reason)
}

// finishStop destroys the runtime sandbox of a stopping sandbox of this node
// and marks it stopped. Concurrent calls for one sandbox wait for the first.
func (m *Manager) finishStop(ctx context.Context, id, reason string) error {
	m.mu.Lock()
	if done, ok := m.stopping[id]; ok {
		m.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	done := make(chan struct{})
	m.stopping[id] = done
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.stopping, id)
		m.mu.Unlock()
		close(done)
	}()

	rsb, err := m.rt.Get(ctx, id)
	switch {
	case errors.Is(err, runtime.ErrNotFound):
	case err != nil:
		return fmt.Errorf("attach to sandbox %s: %w", id, err)
	default:
		if err := rsb.Destroy(ctx); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
	}
	if err := m.ended(ctx, id); err != nil {
		return err
	}
	if _, err := m.st.TransitionSandbox(ctx, id, []store.SandboxStatus{store.SandboxStopping}, store.SandboxStopped, reason, m.now()); err != nil {
		return fmt.Errorf("mark sandbox %s stopped: %w", id, err)
	}
	m.log.Info("sandbox stopped", "sandbox_id", id, "reason", reason)
	return nil
}

// markFailed moves sandbox id from one of the statuses from to failed with
// reason, and runs the stop hooks whatever the transition did (its key is
// revoked, its network removed: nothing outlives a sandbox that is not
// running). Every path on which a sandbox ends goes through here or
// finishStop. It reports whether this call made the transition.
func (m *Manager) markFailed(ctx context.Context, id string, from []store.SandboxStatus, reason string) bool {
	ok, err := m.st.TransitionSandbox(ctx, id, from, store.SandboxFailed, reason, m.now())
	if err != nil {
		m.log.Error("mark sandbox failed", "sandbox_id", id, "err", err)
	}
	// Whatever the transition did, what the sandbox held goes: a key must
	// not outlive a sandbox that is not running (errors are logged).
	_ = m.ended(ctx, id)
	return ok
}

// StopAll stops every active sandbox of this node (a shutdown without
// --keep-sandboxes, a drain). One paused with its files alone is left
// paused: nothing of it is on this node, and any node resumes it.
func (m *Manager) StopAll(ctx context.Context, reason string) error {
	rows, err := m.st.ListSandboxesByNode(ctx, m.cfg.NodeID, activeStatuses...)
	if err != nil {
		return fmt.Errorf("list sandboxes of node: %w", err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(rows))
	for i, sb := range rows {
		if sb.FilesPaused() {
			continue
		}
		if sb.Movable() {
			// Its state is in the blob store: it stays paused, and
			// any node resumes it once this one is down.
			continue
		}
		wg.Go(func() { errs[i] = m.stop(ctx, sb, reason) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// setNetwork replaces a running sandbox's network policy without
// restarting it: the row first (so a restart or another node rebuilds the
// new policy: see Reconcile), then the update hooks (the network hook
// changes the host's rules), the row going back when one refuses. Only a
// sandbox created with a network has one to change; to none and back is
// allowed.
func (m *Manager) setNetwork(ctx context.Context, sb store.Sandbox, p netpol.Policy) (store.Sandbox, error) {
	ctx = context.WithoutCancel(ctx) // row and rules must not part ways
	m.netMu.Lock()
	defer m.netMu.Unlock()
	// The row as it is now: another change may have come since the
	// caller read it, and a failure must restore that one.
	sb, err := m.st.GetSandbox(ctx, sb.ID)
	if err != nil {
		return sb, err
	}
	if _, err := m.Local(ctx, sb); err != nil {
		return sb, err
	}
	if m.network == nil {
		return sb, errdefs.New(errdefs.ErrInvalid, "networking is not enabled on this server")
	}
	network, err := json.Marshal(p)
	if err != nil {
		return sb, err
	}
	next := sb
	next.Network = string(network)
	if err := m.checkUpdate(ctx, sb, next); err != nil {
		return sb, err
	}
	ok, err := m.st.SetSandboxNetwork(ctx, sb.ID, next.Network)
	if err != nil {
		return sb, err
	}
	if !ok {
		return sb, errdefs.ErrNotRunning
	}
	if err := m.update(ctx, next); err != nil {
		if _, rerr := m.st.SetSandboxNetwork(ctx, sb.ID, sb.Network); rerr != nil {
			m.log.Error("restore network policy on the row", "sandbox_id", sb.ID, "err", rerr)
		}
		return sb, err
	}
	m.log.Info("sandbox network changed", "sandbox_id", sb.ID, "account_id", sb.AccountID, "mode", p.Mode)
	return m.st.GetSandbox(ctx, sb.ID)
}

// TrafficOf is what a running sandbox of this node's network carried so
// far; nil for one without a network, or hosted elsewhere. It takes the row
// the caller (a run of this node) holds; front ends call Traffic by id.
func (m *Manager) TrafficOf(_ context.Context, sb store.Sandbox) (*netpol.Traffic, error) {
	if m.network == nil || sb.NodeID != m.cfg.NodeID {
		return nil, nil
	}
	return m.network.Traffic(sb.ID)
}

// GuestAddr is the address the host reaches sandbox id's network at (for
// the port proxy), waking it first when it is paused; the network's owner
// (NetworkOwner) answers. An error when it has none.
func (m *Manager) GuestAddr(ctx context.Context, id string) (netip.Addr, error) {
	if m.network == nil {
		return netip.Addr{}, errdefs.ErrNotFound
	}
	// The proxy wakes a paused sandbox like any call.
	if sb, err := m.st.GetSandbox(ctx, id); err == nil && sb.Pause != "" && sb.NodeID == m.cfg.NodeID {
		if _, err := m.awake(ctx, sb); err != nil {
			return netip.Addr{}, err
		}
	}
	addr, err := m.network.GuestAddr(id)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("sandbox %s has no network: %w", id, errdefs.ErrNotFound)
	}
	return addr, nil
}

// StopQuietly stops a sandbox on an error path, logging what fails.
func (m *Manager) StopQuietly(ctx context.Context, sb store.Sandbox, reason string) {
	if err := m.stop(ctx, sb, reason); err != nil {
		m.log.Error("stop sandbox", "sandbox_id", sb.ID, "err", err)
	}
}

// setTimeout makes the sandbox stop d from now.
func (m *Manager) setTimeout(ctx context.Context, sb store.Sandbox, d time.Duration) (store.Sandbox, error) {
	if d > m.cfg.Settings.MaxTimeout {
		return sb, errdefs.Newf(errdefs.ErrInvalid, "timeout must be at most %d ms", m.cfg.Settings.MaxTimeout.Milliseconds())
	}
	if sb.Status != store.SandboxRunning && sb.Status != store.SandboxPending {
		return sb, errdefs.ErrNotRunning
	}
	if sb.Pause != "" {
		// Its clock is stopped: d is what it will have when it resumes.
		return m.setPausedTimeout(ctx, sb, d)
	}
	if err := m.st.SetSandboxDeadline(ctx, sb.ID, m.now().Add(d)); err != nil {
		return sb, fmt.Errorf("set deadline of %s: %w", sb.ID, err)
	}
	return m.st.GetSandbox(ctx, sb.ID)
}

// DeleteEnvironment stops the account's sandboxes, deletes its repository
// and snapshots and clears its row; idempotent.
func (m *Manager) DeleteEnvironment(ctx context.Context, accountID string) (*store.Environment, error) {
	ctx = context.WithoutCancel(ctx)
	rows, err := m.st.ListSandboxes(ctx, accountID)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of %s: %w", accountID, err)
	}
	for _, sb := range rows {
		if sb.Status == store.SandboxPending || sb.Status == store.SandboxRunning || sb.Status == store.SandboxStopping {
			if err := m.stop(ctx, sb, "account environment deleted"); err != nil {
				return nil, err
			}
		}
	}
	// The answer is the row as it was; persistence, which owns the row,
	// deletes it with the snapshots (without persistence there is none).
	var deleted *store.Environment
	switch env, err := m.st.GetEnvironment(ctx, accountID); {
	case err == nil:
		deleted = &env
	case !errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("load environment of %s: %w", accountID, err)
	}
	if m.cfg.Persist != nil {
		if err := m.cfg.Persist.DeleteAccount(ctx, accountID); err != nil {
			return nil, fmt.Errorf("delete data of %s: %w", accountID, err)
		}
	}
	// A sandbox started ahead from the snapshot holds its files too.
	m.dropPrewarmed(ctx, accountID)
	return deleted, nil
}

// Setups is the account setup task as the lifecycle needs it: a new
// account's first sandbox starts its setup, and runs wait for a setup in
// progress. internal/agents serves it (Config.Setups).
type Setups interface {
	// IfNew starts the account's setup if it never had one.
	IfNew(ctx context.Context, accountID string) error
	// Pending says the account's setup is queued or executing.
	Pending(ctx context.Context, accountID string) bool
}

// SetupPending implements runs.Host.
func (m *Manager) SetupPending(ctx context.Context, accountID string) bool {
	return m.cfg.Setups != nil && m.cfg.Setups.Pending(ctx, accountID)
}

// AtQuota reports whether the account has no free sandbox place (with
// extra more allowed). It is only a hint for waiting: Launch checks again,
// atomically.
func (m *Manager) AtQuota(ctx context.Context, accountID string, extra int) bool {
	limit := m.sandboxLimits(extra).PerAccount
	if limit <= 0 {
		return false
	}
	n, err := m.st.CountActiveSandboxes(ctx, accountID)
	return err == nil && n >= limit
}
