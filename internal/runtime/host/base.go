package host

// The half of a backend's Runtime that every backend shares.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Options are the options every backend takes alike; each backend's own
// Options repeat these fields (they are its callers' API) and pass them on.
type Options struct {
	// StateDir holds everything the backend keeps on the host; required.
	StateDir string
	// Logger is nil for no logs.
	Logger *slog.Logger
	// DefaultLimits fill a Spec's zero limits; zero: the backend's, or
	// DefaultLimits.
	DefaultLimits runtime.Limits
	// StartTimeout bounds how long Create waits for the agent; zero: the
	// backend's.
	StartTimeout time.Duration
	// LogMaxBytes caps each log a sandbox's guest can write to (0:
	// caplog.DefaultSize).
	LogMaxBytes int64
	// Home and HomeMetrics are each sandbox's gate to sandboxd.internal
	// (see homegate.Options).
	Home        homegate.Limits
	HomeMetrics *homegate.Metrics
}

// DefaultLimits are the limits of a sandbox whose backend was given none.
var DefaultLimits = runtime.Limits{CPUs: 2, MemoryBytes: 2 << 30, Pids: 1024, DiskBytes: 10 << 30}

// Served is what Base needs of a backend's sandbox.
type Served interface {
	comparable
	runtime.Sandbox
	// Detach lets go of the sandbox without touching it: at Close,
	// sandboxes keep running for the next process to reattach.
	Detach()
	// MarkGone records that the sandbox was destroyed.
	MarkGone()
}

// Base is the half of a backend's Runtime that every backend shares,
// embedded by each: the options all backends take, the state directory and
// the table of attached sandboxes, the context that ends at Close. It
// implements runtime.Runtime's Name, Get and List.
type Base[S Served] struct {
	name   string
	opts   Options
	log    *slog.Logger
	table  *Table[S]
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
}

// NewBase starts the common half of backend name: it needs root (for what
// root says), StateDir is required and made absolute, the zero options take
// the backend's defaults, and the state directory gets sandboxes/, ids/
// and the backend's own dirs.
func NewBase[S Served](ctx context.Context, name, root string, o, defaults Options, dirs ...string) (*Base[S], error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%s runtime: needs root (%s)", name, root)
	}
	if o.StateDir == "" {
		return nil, fmt.Errorf("%s runtime: StateDir is required", name)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.DefaultLimits == (runtime.Limits{}) {
		o.DefaultLimits = defaults.DefaultLimits
	}
	if o.DefaultLimits == (runtime.Limits{}) {
		o.DefaultLimits = DefaultLimits
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = defaults.StartTimeout
	}
	state, err := filepath.Abs(o.StateDir)
	if err != nil {
		return nil, fmt.Errorf("%s runtime: state dir: %w", name, err)
	}
	o.StateDir = state
	for _, d := range append(dirs, "sandboxes", "ids") {
		if err := os.MkdirAll(filepath.Join(state, d), 0o700); err != nil {
			return nil, fmt.Errorf("%s runtime: create state dir: %w", name, err)
		}
	}
	// The runtime's context outlives New's: it ends at Close.
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	return &Base[S]{
		name: name, opts: o, log: o.Logger.With("runtime", name),
		table: NewTable[S](state), ctx: rctx, cancel: cancel,
	}, nil
}

// Name implements runtime.Runtime.
func (b *Base[S]) Name() string { return b.name }

// StateDir is the absolute state directory.
func (b *Base[S]) StateDir() string { return b.opts.StateDir }

// StartTimeout bounds how long Create waits for a sandbox's agent.
func (b *Base[S]) StartTimeout() time.Duration { return b.opts.StartTimeout }

// Log is the backend's logger.
func (b *Base[S]) Log() *slog.Logger { return b.log }

// Context ends at Close (or Abort): what a sandbox runs on the host while
// this process serves it runs under it.
func (b *Base[S]) Context() context.Context { return b.ctx }

// Table is the state directory and the attached sandboxes.
func (b *Base[S]) Table() *Table[S] { return b.table }

// Limits fills the zero fields of l from the default limits.
func (b *Base[S]) Limits(l runtime.Limits) runtime.Limits { return Limits(l, b.opts.DefaultLimits) }

// Settings are what each sandbox's Attachment is given.
func (b *Base[S]) Settings() Settings {
	return Settings{
		Home:        homegate.Options{Limits: b.opts.Home, Metrics: b.opts.HomeMetrics, Logger: b.log},
		LogMaxBytes: b.opts.LogMaxBytes, Log: b.log,
	}
}

// Abort ends the context of a Base whose backend failed to start.
func (b *Base[S]) Abort() { b.cancel() }

// Get implements runtime.Runtime.
func (b *Base[S]) Get(ctx context.Context, id string) (runtime.Sandbox, error) {
	s, err := b.table.Get(id)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}

// List implements runtime.Runtime.
func (b *Base[S]) List(ctx context.Context) ([]string, error) { return b.table.List() }

// Check validates and completes spec for Create: a valid id, a BaseDir,
// the default hostname and limits; and the runtime must not be closed.
func (b *Base[S]) Check(spec *runtime.Spec) error {
	if !ValidID(spec.ID) {
		return fmt.Errorf("create sandbox: invalid id %q", spec.ID)
	}
	if spec.BaseDir == "" {
		return fmt.Errorf("create sandbox %s: BaseDir is required", spec.ID)
	}
	if err := runtime.CheckVolumes(spec.Volumes); err != nil {
		return fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	spec.Limits = b.Limits(spec.Limits)
	if spec.Hostname == "" {
		spec.Hostname = "sandbox"
	}
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return fmt.Errorf("create sandbox %s: runtime closed", spec.ID)
	}
	return nil
}

// Made ends a Create of sandbox s for id: when making it failed (err), s
// is destroyed and link, the claim of the id ("" for none), removed.
func (b *Base[S]) Made(ctx context.Context, id, link string, s S, err error) (S, error) {
	if err != nil {
		_ = s.Destroy(context.WithoutCancel(ctx))
		if link != "" {
			_ = os.Remove(link)
		}
		var zero S
		return zero, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	return s, nil
}

// Destroyed ends a Destroy of s, whose backend has torn down what it runs
// (errs are what that failed with): its state directory dir goes, with
// the claim of id if it is still cid's, and s is forgotten.
func (b *Base[S]) Destroyed(s S, dir, id, cid string, errs []error) error {
	if err := b.table.Dir.Remove(dir, id, cid); err != nil {
		errs = append(errs, err)
	}
	s.MarkGone()
	b.table.Remove(cid, s)
	return Errors("destroy sandbox", id, errs)
}

// Shutdown is runtime.Runtime.Close: once only, release frees the
// backend's own (warm sandboxes, templates; nil for none), the context
// ends and every sandbox is detached, left running for the next process.
func (b *Base[S]) Shutdown(release func() error) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	sbs := b.table.All()
	var err error
	if release != nil {
		err = release()
	}
	b.cancel()
	for _, s := range sbs {
		s.Detach()
	}
	return err
}

// Errors is the error of op on sandbox id after a teardown that went on
// past its failures errs: nil when there are none.
func Errors(op, id string, errs []error) error {
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s %s: %w", op, id, err)
	}
	return nil
}

// FindAgent returns path, or when it is empty, the sandbox-agent binary
// next to the running executable, or else in PATH.
func FindAgent(path string) (string, error) {
	if path != "" {
		return path, nil
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "sandbox-agent")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath("sandbox-agent")
	if err != nil {
		return "", errors.New("sandbox-agent binary not found next to the executable or in PATH (build it with CGO_ENABLED=0 go build ./cmd/sandbox-agent)")
	}
	return p, nil
}

// Once makes f run at most once, however often the function it returns is
// called (a resume after a quiesce); later calls return nil.
func Once(f func(context.Context) error) func(context.Context) error {
	var once sync.Once
	return func(ctx context.Context) error {
		var err error
		once.Do(func() { err = f(ctx) })
		return err
	}
}

// Backoff is the wait between retries of something that keeps failing (a
// warm sandbox, a template): First, doubled after each failure up to Max.
type Backoff struct {
	First, Max time.Duration
	next       time.Duration
}

// Wait waits out the current delay and doubles the next; false when ctx
// ended first.
func (b *Backoff) Wait(ctx context.Context) bool {
	if b.next == 0 {
		b.next = b.First
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(b.next):
	}
	b.next = min(b.next*2, b.Max)
	return true
}

// Reset starts the delays again from First, after a success.
func (b *Backoff) Reset() { b.next = b.First }
