// Package runtimefake is an in-memory runtime.Runtime for tests of the
// control plane (the sandbox manager, runs, persistence) that must run in
// seconds and without root, runsc or KVM: a test support package beside
// runtimetest, in the way Nomad's mock driver serves its client's tests.
//
// It keeps the runtime contract's observable rules — ids are unique, a
// destroyed sandbox is gone (ErrNotFound), a stopped one answers
// ErrNotRunning, Destroy is idempotent — and lets a test script what real
// backends do on their own: process results (Exec), a sandbox dying under
// the service (Kill), a host losing it (Lose), and failures (FailCreate).
// Files live in memory; Snapshot writes them in the real snapshot format.
// It is never used by production code.
package runtimefake

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/snapshot"
)

// ExecFunc scripts a process: it gets the sandbox and the request (its
// writers included) and returns how the process ended.
type ExecFunc func(ctx context.Context, sb *Sandbox, req runtime.ExecRequest) (runtime.ExecResult, error)

// Runtime is the fake backend, scripted with SetExec and FailCreate and
// disturbed with Kill, Lose and Add. Safe for concurrent use.
type Runtime struct {
	mu sync.Mutex
	// exec runs every process of every sandbox; nil: exit 0, no output.
	exec ExecFunc
	// failCreate, when set, decides whether a Create fails (before
	// anything exists, as the contract wants).
	failCreate func(spec runtime.Spec) error
	caps       runtime.Capabilities
	sandboxes  map[string]*Sandbox
	specs      map[string]runtime.Spec
	creates    int
	destroys   map[string]int
	// prewarm enables Prewarm; prewarmed is each owner's kept key
	// (runtime.PrewarmKey), claimed the sandboxes Create made from one.
	failPause error
	// refuseSave, when set, is what CheckSave answers (and Pause and
	// Fork fail with): a save the runtime cannot do now.
	refuseSave error
	prewarm    bool
	prewarmed  map[string]fakePrewarmed
	prewarms   uint64
	claimed    map[string]bool
	// pools are SetPool's, by name; pooled the sandboxes Create made
	// from one of theirs.
	pools  map[string]*fakePool
	pooled map[string]bool
	// warmSize is SetWarmSize's; the fake keeps no warm sandboxes.
	warmSize int
}

// fakePool is one pool: its size, opener, and the key and count of the
// sandboxes FillPools started.
type fakePool struct {
	open  func(context.Context) (runtime.Spec, func(), error)
	key   string
	stats runtime.PoolStats
	specs []runtime.Spec // the specs its sandboxes were started from
}

// New returns an empty fake runtime.
func New() *Runtime {
	return &Runtime{caps: runtime.Capabilities{Network: true, AnyRootFS: true}, sandboxes: map[string]*Sandbox{}, specs: map[string]runtime.Spec{}, destroys: map[string]int{}, prewarmed: map[string]fakePrewarmed{}, claimed: map[string]bool{}, pools: map[string]*fakePool{}, pooled: map[string]bool{}}
}

var (
	_ runtime.Runtime     = (*Runtime)(nil)
	_ runtime.Prewarmer   = (*Runtime)(nil)
	_ runtime.Pooler      = (*Runtime)(nil)
	_ runtime.Pauser      = (*Runtime)(nil)
	_ runtime.Forker      = (*Runtime)(nil)
	_ runtime.SaveChecker = (*Runtime)(nil)
)

// Fork implements runtime.Forker: each child gets a copy of the parent's
// files, all or none (FailCreate fails a child as it fails a Create).
func (r *Runtime) Fork(_ context.Context, parentID string, children []runtime.Spec) ([]runtime.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.sandboxes[parentID]
	switch {
	case !ok:
		return nil, fmt.Errorf("fork %s: %w", parentID, runtime.ErrNotFound)
	case p.stopped || p.paused:
		return nil, fmt.Errorf("fork %s: %w", parentID, runtime.ErrNotRunning)
	case r.refuseSave != nil:
		return nil, fmt.Errorf("fork %s: %w", parentID, r.refuseSave)
	}
	if err := runtime.ForkSpecs(r.specs[parentID].Network != nil, children); err != nil {
		return nil, err
	}
	out := make([]runtime.Sandbox, len(children))
	for i, spec := range children {
		if _, ok := r.sandboxes[spec.ID]; ok {
			return nil, fmt.Errorf("fork %s: %w", spec.ID, runtime.ErrExists)
		}
		if r.failCreate != nil {
			if err := r.failCreate(spec); err != nil {
				return nil, fmt.Errorf("fork %s: %w", spec.ID, err)
			}
		}
		sb := &Sandbox{rt: r, id: spec.ID, files: maps.Clone(p.files), created: time.Now()}
		out[i] = sb
	}
	for i, spec := range children {
		r.sandboxes[spec.ID] = out[i].(*Sandbox)
		r.specs[spec.ID] = spec
	}
	return out, nil
}

// Pause implements runtime.Pauser: the sandbox keeps its files and
// refuses calls until Resume; failPause, when set, fails it instead.
func (r *Runtime) Pause(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	switch {
	case !ok:
		return fmt.Errorf("pause %s: %w", id, runtime.ErrNotFound)
	case sb.stopped || sb.paused:
		return fmt.Errorf("pause %s: %w", id, runtime.ErrNotRunning)
	case r.failPause != nil:
		return fmt.Errorf("pause %s: %w", id, r.failPause)
	case r.refuseSave != nil:
		return fmt.Errorf("pause %s: %w", id, r.refuseSave)
	}
	sb.paused = true
	return nil
}

// Resume implements runtime.Pauser.
func (r *Runtime) Resume(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	switch {
	case !ok:
		return fmt.Errorf("resume %s: %w", id, runtime.ErrNotFound)
	case !sb.paused:
		return fmt.Errorf("resume %s: not paused", id)
	}
	sb.paused = false
	return nil
}

// RefuseSave makes CheckSave, Pause and Fork refuse to save a sandbox
// with err (which should wrap runtime.ErrCannotPause; nil: they save
// again), leaving it as it is.
func (r *Runtime) RefuseSave(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refuseSave = err
}

// CheckSave implements runtime.SaveChecker.
func (r *Runtime) CheckSave(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	switch {
	case !ok:
		return fmt.Errorf("check save %s: %w", id, runtime.ErrNotFound)
	case sb.stopped:
		return fmt.Errorf("check save %s: %w", id, runtime.ErrNotRunning)
	}
	return r.refuseSave
}

// FailPause makes Pause fail with err (nil: succeed again).
func (r *Runtime) FailPause(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failPause = err
}

// EnablePrewarm makes Prewarm keep what it is asked for (off, it keeps
// nothing, like a backend with a budget of 0).
func (r *Runtime) EnablePrewarm() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prewarm = true
}

// fakePrewarmed is what is kept for an owner: n sandboxes of key.
type fakePrewarmed struct {
	key string
	n   int
}

// Prewarm implements runtime.Prewarmer: it reads the layers and counts one
// more sandbox of the spec's key for its owner, up to want, with no budget;
// Create hands them out as real backends do (same runtime.PrewarmKey, one
// at a time; another key for the owner drops them).
func (r *Runtime) Prewarm(ctx context.Context, spec runtime.Spec, want int) (bool, error) {
	key, ok := runtime.PrewarmKey(spec)
	if !ok {
		return false, fmt.Errorf("prewarm: spec cannot be prewarmed")
	}
	for _, l := range spec.Layers {
		if _, err := io.Copy(io.Discard, l.R); err != nil {
			return false, fmt.Errorf("prewarm: read layer %s: %w", l.ID, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.prewarm {
		return false, nil
	}
	kept := r.prewarmed[spec.Owner]
	if kept.key != key {
		kept = fakePrewarmed{key: key}
	}
	want = max(want, 1)
	started := kept.n < want
	if started {
		kept.n++
		r.prewarms++
	}
	kept.n = min(kept.n, want)
	r.prewarmed[spec.Owner] = kept
	return started, nil
}

// DropPrewarmed implements runtime.Prewarmer.
func (r *Runtime) DropPrewarmed(_ context.Context, owner string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.prewarmed, owner)
	return nil
}

// PrewarmStats implements runtime.Prewarmer: what is kept, and how many
// were kept and handed out.
func (r *Runtime) PrewarmStats() runtime.PrewarmStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	var taken uint64
	for _, c := range r.claimed {
		if c {
			taken++
		}
	}
	kept := 0
	for _, p := range r.prewarmed {
		kept += p.n
	}
	return runtime.PrewarmStats{Kept: kept, Started: r.prewarms, Taken: taken}
}

// PrewarmedFor says whether a sandbox is kept for owner.
func (r *Runtime) PrewarmedFor(owner string) bool { return r.PrewarmedCount(owner) > 0 }

// PrewarmedCount says how many sandboxes are kept for owner.
func (r *Runtime) PrewarmedCount(owner string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.prewarmed[owner].n
}

// Claimed says whether sandbox id was made from a prewarmed one.
func (r *Runtime) Claimed(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claimed[id]
}

// SetPool implements runtime.Pooler: it records the pool; FillPools
// starts its sandboxes (a real backend's fillers run in the background).
func (r *Runtime) SetPool(name string, size int, open func(ctx context.Context) (runtime.Spec, func(), error)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.pools[name]
	switch {
	case size <= 0:
		delete(r.pools, name)
		return
	case !ok:
		p = &fakePool{}
		p.stats.Name = name
		r.pools[name] = p
	}
	p.open, p.stats.Size = open, size
	if p.stats.Ready > size {
		p.stats.Discarded += uint64(p.stats.Ready - size)
		p.stats.Ready = size
	}
}

// FillPools starts what each pool lacks, from the specs its open makes
// (their layers read to their end), and returns the first error.
func (r *Runtime) FillPools(ctx context.Context) error {
	r.mu.Lock()
	pools := maps.Clone(r.pools)
	r.mu.Unlock()
	for _, p := range pools {
		for {
			r.mu.Lock()
			need := p.stats.Size - p.stats.Ready
			open := p.open
			r.mu.Unlock()
			if need <= 0 {
				break
			}
			// Starting while open runs, as a real pool's start is.
			r.mu.Lock()
			p.stats.Starting++
			r.mu.Unlock()
			spec, release, err := open(ctx)
			r.mu.Lock()
			p.stats.Starting--
			r.mu.Unlock()
			if err != nil {
				r.mu.Lock()
				p.stats.Failed++
				r.mu.Unlock()
				return err
			}
			for _, l := range spec.Layers {
				_, err = io.Copy(io.Discard, l.R)
			}
			release()
			key, ok := runtime.PoolKey(spec)
			if err != nil || !ok {
				return fmt.Errorf("pool %s: a spec that cannot be pooled (%v)", p.stats.Name, err)
			}
			r.mu.Lock()
			if key != p.key {
				p.stats.Discarded += uint64(p.stats.Ready)
				p.key, p.stats.Ready, p.stats.Template = key, 0, spec.Template
			}
			p.stats.Ready++
			p.stats.Started++
			p.specs = append(p.specs, spec)
			r.mu.Unlock()
		}
	}
	return nil
}

// PoolStats implements runtime.Pooler (no warm pool, nothing removed).
func (r *Runtime) PoolStats() runtime.PoolReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := runtime.PoolReport{Warm: runtime.PoolStats{Size: r.warmSize}}
	for _, p := range r.pools {
		rep.Pools = append(rep.Pools, p.stats)
	}
	sort.Slice(rep.Pools, func(i, j int) bool { return rep.Pools[i].Name < rep.Pools[j].Name })
	return rep
}

// SetWarmSize implements runtime.WarmSizer: the size is kept (WarmSize),
// nothing is started.
func (r *Runtime) SetWarmSize(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warmSize = n
}

// WarmSize is what SetWarmSize last set.
func (r *Runtime) WarmSize() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.warmSize
}

// PoolSpecs are the specs pool name's sandboxes were started from.
func (r *Runtime) PoolSpecs(name string) []runtime.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pools[name]; ok {
		return slices.Clone(p.specs)
	}
	return nil
}

// Pooled says whether sandbox id was made from a pooled one.
func (r *Runtime) Pooled(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pooled[id]
}

// SetExec scripts the processes of every sandbox from now on.
func (r *Runtime) SetExec(fn ExecFunc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exec = fn
}

// FailCreate makes Create return fn's error when it is not nil.
func (r *Runtime) FailCreate(fn func(spec runtime.Spec) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failCreate = fn
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return "fake" }

// Capabilities implements runtime.Runtime: networks by default (the fake
// only records Spec.Network), as set by SetCapabilities.
func (r *Runtime) Capabilities() runtime.Capabilities {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.caps
}

// SetCapabilities makes the runtime claim caps.
func (r *Runtime) SetCapabilities(caps runtime.Capabilities) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.caps = caps
}

// Create implements runtime.Runtime. The layers are read to their end (a
// real backend consumes them) and their ids kept in the spec.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	fail := r.failCreate
	_, exists := r.sandboxes[spec.ID]
	r.mu.Unlock()
	if exists {
		return nil, fmt.Errorf("create %s: %w", spec.ID, runtime.ErrExists)
	}
	if fail != nil {
		if err := fail(spec); err != nil {
			return nil, fmt.Errorf("create %s: %w", spec.ID, err)
		}
	}
	r.mu.Lock()
	key, ok := runtime.PrewarmKey(spec)
	kept, found := r.prewarmed[spec.Owner]
	claimed := ok && found && kept.key == key && kept.n > 0
	switch {
	case claimed && kept.n > 1:
		r.prewarmed[spec.Owner] = fakePrewarmed{key: key, n: kept.n - 1}
	case ok && found:
		delete(r.prewarmed, spec.Owner)
	}
	pooled := false
	if pkey, ok := runtime.PoolKey(spec); ok && !claimed {
		for _, p := range r.pools {
			if p.key != pkey {
				continue
			}
			if p.stats.Ready > 0 {
				p.stats.Ready--
				p.stats.Hits++
				pooled = true
			} else {
				p.stats.Misses++
			}
			break
		}
	}
	r.mu.Unlock()
	if !claimed && !pooled {
		for _, l := range spec.Layers {
			if _, err := io.Copy(io.Discard, l.R); err != nil {
				return nil, fmt.Errorf("create %s: read layer %s: %w", spec.ID, l.ID, err)
			}
		}
	}
	sb := &Sandbox{rt: r, id: spec.ID, files: map[string][]byte{}, created: time.Now()}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.sandboxes[spec.ID]; ok {
		return nil, fmt.Errorf("create %s: %w", spec.ID, runtime.ErrExists)
	}
	r.claimed[spec.ID] = claimed
	r.pooled[spec.ID] = pooled
	r.sandboxes[spec.ID] = sb
	r.specs[spec.ID] = spec
	r.creates++
	return sb, nil
}

// Get implements runtime.Runtime.
func (r *Runtime) Get(_ context.Context, id string) (runtime.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", id, runtime.ErrNotFound)
	}
	return sb, nil
}

// List implements runtime.Runtime.
func (r *Runtime) List(context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.sandboxes))
	for id := range r.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// Close implements runtime.Runtime; sandboxes stay, as with a real backend.
func (r *Runtime) Close() error { return nil }

// Spec is what sandbox id was created with.
func (r *Runtime) Spec(id string) (runtime.Spec, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.specs[id]
	return s, ok
}

// Creates counts the successful Creates.
func (r *Runtime) Creates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.creates
}

// Destroys counts the Destroys of sandbox id that found it.
func (r *Runtime) Destroys(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.destroys[id]
}

// Add puts a sandbox on the host that the service did not create (as
// after a crash between the runtime's create and the database's record).
func (r *Runtime) Add(id string) *Sandbox {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := &Sandbox{rt: r, id: id, files: map[string][]byte{}, created: time.Now()}
	r.sandboxes[id] = sb
	return sb
}

// Kill stops sandbox id as if its processes died on their own: it stays on
// the host, stopped.
func (r *Runtime) Kill(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.sandboxes[id]; ok {
		sb.stopped = true
	}
}

// Lose removes sandbox id as if the host lost it (a reboot, a crash).
func (r *Runtime) Lose(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.sandboxes, id)
}

// Sandbox is one fake sandbox; its files are in memory.
type Sandbox struct {
	rt      *Runtime
	id      string
	created time.Time
	// Guarded by rt.mu.
	stopped bool
	paused  bool
	files   map[string][]byte
	execs   [][]string
	stops   int
	unpacks int
}

var _ runtime.Sandbox = (*Sandbox)(nil)

// ID implements runtime.Sandbox.
func (s *Sandbox) ID() string { return s.id }

// Info implements runtime.Sandbox.
func (s *Sandbox) Info() runtime.Info {
	return runtime.Info{Backend: "fake", Platform: "memory", Kernel: "fake", Agent: "fake"}
}

// alive is nil when the sandbox is present and running.
func (s *Sandbox) alive() error {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	if s.rt.sandboxes[s.id] != s {
		return fmt.Errorf("sandbox %s: %w", s.id, runtime.ErrNotFound)
	}
	if s.stopped || s.paused {
		return fmt.Errorf("sandbox %s: %w", s.id, runtime.ErrNotRunning)
	}
	return nil
}

// State implements runtime.Sandbox.
func (s *Sandbox) State(context.Context) (runtime.State, error) {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	if s.rt.sandboxes[s.id] != s {
		return "", fmt.Errorf("sandbox %s: %w", s.id, runtime.ErrNotFound)
	}
	if s.stopped {
		return runtime.StateStopped, nil
	}
	if s.paused {
		return runtime.StatePaused, nil
	}
	return runtime.StateRunning, nil
}

// Exec implements runtime.Sandbox with the runtime's ExecFunc. A Timeout
// is honoured as real backends do: the script's context ends with it and
// the result says TimedOut.
func (s *Sandbox) Exec(ctx context.Context, req runtime.ExecRequest) (runtime.ExecResult, error) {
	if err := s.alive(); err != nil {
		return runtime.ExecResult{}, err
	}
	s.rt.mu.Lock()
	fn := s.rt.exec
	s.execs = append(s.execs, slices.Clone(req.Cmd))
	s.rt.mu.Unlock()
	if req.Stdout == nil {
		req.Stdout = io.Discard
	}
	if req.Stderr == nil {
		req.Stderr = io.Discard
	}
	if fn == nil {
		return runtime.ExecResult{}, nil
	}
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	start := time.Now()
	res, err := fn(ctx, s, req)
	res.Duration = time.Since(start)
	if err == nil && req.Timeout > 0 && ctx.Err() == context.DeadlineExceeded {
		res.TimedOut, res.ExitCode, res.Signal = true, 137, 9
	}
	return res, err
}

// Attach implements runtime.Sandbox: scripted processes end with their
// Exec, so there is never one to attach to.
func (s *Sandbox) Attach(context.Context, runtime.AttachRequest) (runtime.ExecResult, error) {
	if err := s.alive(); err != nil {
		return runtime.ExecResult{}, err
	}
	return runtime.ExecResult{}, fmt.Errorf("attach in fake sandbox %s: %w", s.id, fs.ErrNotExist)
}

// Processes implements runtime.Sandbox: none outlive their Exec.
func (s *Sandbox) Processes(context.Context) ([]runtime.Process, error) {
	return nil, s.alive()
}

// SignalProcess implements runtime.Sandbox: there is no process to signal.
func (s *Sandbox) SignalProcess(_ context.Context, pid int, _ syscall.Signal) error {
	if err := s.alive(); err != nil {
		return err
	}
	return fmt.Errorf("signal %d in fake sandbox %s: %w", pid, s.id, fs.ErrNotExist)
}

// Execs are the command lines run so far.
func (s *Sandbox) Execs() [][]string {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	return slices.Clone(s.execs)
}

// Stops counts Stop calls.
func (s *Sandbox) Stops() int {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	return s.stops
}

func clean(p string) string { return path.Clean("/" + p) }

// ReadFile implements runtime.Sandbox.
func (s *Sandbox) ReadFile(_ context.Context, p string) (io.ReadCloser, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	b, ok := s.files[clean(p)]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// WriteFile implements runtime.Sandbox.
func (s *Sandbox) WriteFile(_ context.Context, p string, r io.Reader, _ fs.FileMode) error {
	if err := s.alive(); err != nil {
		return err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	s.files[clean(p)] = b
	return nil
}

// Unpack implements runtime.Unpacker: the archive's regular files are
// kept as WriteFile keeps them, at dir/name; directories and links are
// counted out (the fake keeps files only).
func (s *Sandbox) Unpack(_ context.Context, dir string, r io.Reader) (int, error) {
	if err := s.alive(); err != nil {
		return 0, err
	}
	files := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("unpack into %s: %w", dir, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return 0, fmt.Errorf("unpack into %s: %w", dir, err)
		}
		files[clean(path.Join(dir, hdr.Name))] = b
	}
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	s.unpacks++
	maps.Copy(s.files, files)
	return len(files), nil
}

// Unpacks is how many times Unpack wrote into the sandbox.
func (s *Sandbox) Unpacks() int {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	return s.unpacks
}

// File returns the content of p, or false.
func (s *Sandbox) File(p string) ([]byte, bool) {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	b, ok := s.files[clean(p)]
	return b, ok
}

// Files returns a copy of every file of the sandbox, by path; it answers
// after the sandbox stopped or was destroyed too.
func (s *Sandbox) Files() map[string][]byte {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	out := make(map[string][]byte, len(s.files))
	for p, b := range s.files {
		out[p] = bytes.Clone(b)
	}
	return out
}

// ListDir implements runtime.Sandbox: the files directly under p.
func (s *Sandbox) ListDir(_ context.Context, p string) ([]runtime.DirEntry, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	dir := clean(p)
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	var out []runtime.DirEntry
	dirs := map[string]bool{}
	for name, b := range s.files {
		rel, ok := strings.CutPrefix(name, strings.TrimSuffix(dir, "/")+"/")
		switch {
		case !ok:
		case !strings.Contains(rel, "/"):
			out = append(out, runtime.DirEntry{Name: rel, Size: int64(len(b)), Mode: 0o644, ModTime: s.created})
		default:
			// A directory: the fake keeps files only, by their paths.
			sub, _, _ := strings.Cut(rel, "/")
			if !dirs[sub] {
				dirs[sub] = true
				out = append(out, runtime.DirEntry{Name: sub, Mode: fs.ModeDir | 0o755, ModTime: s.created})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// AgentTransport implements runtime.Sandbox: the fake has no guest agent
// to carry requests to (what a front end answers a runtime without one).
func (s *Sandbox) AgentTransport(context.Context) (http.RoundTripper, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	return nil, errdefs.New(errdefs.ErrInvalid, "the fake runtime does not expose its sandboxes' agents")
}

// Quiesce implements runtime.Sandbox; there is nothing to freeze.
func (s *Sandbox) Quiesce(context.Context) (func(context.Context) error, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	return func(context.Context) error { return nil }, nil
}

// Snapshot implements runtime.Sandbox: the sandbox's files, written to a
// scratch directory, in the real layer format, with the manifest's base
// and parent from its spec.
func (s *Sandbox) Snapshot(ctx context.Context, w io.Writer) (snapshot.Manifest, error) {
	s.rt.mu.Lock()
	files := make(map[string][]byte, len(s.files))
	for p, b := range s.files {
		files[p] = b
	}
	s.rt.mu.Unlock()
	dir, err := os.MkdirTemp("", "runtimefake-")
	if err != nil {
		return snapshot.Manifest{}, err
	}
	defer os.RemoveAll(dir)
	for p, b := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return snapshot.Manifest{}, err
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			return snapshot.Manifest{}, err
		}
	}
	// As the real backends record it: the base and the last layer the
	// sandbox was restored from.
	s.rt.mu.Lock()
	spec := s.rt.specs[s.id]
	s.rt.mu.Unlock()
	m := snapshot.Manifest{BaseImage: spec.BaseImage}
	if n := len(spec.Layers); n > 0 {
		m.Parent = spec.Layers[n-1].ID
	}
	return snapshot.Write(ctx, w, dir, m, nil)
}

// Stats implements runtime.Sandbox.
func (s *Sandbox) Stats(context.Context) (runtime.Stats, error) {
	return runtime.Stats{DiskBytes: s.HostDiskBytes()}, nil
}

// HostDiskBytes implements runtime.Sandbox: the bytes of its files.
func (s *Sandbox) HostDiskBytes() int64 {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	var n int64
	for _, b := range s.files {
		n += int64(len(b))
	}
	return n
}

// Stop implements runtime.Sandbox.
func (s *Sandbox) Stop(context.Context) error {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	s.stops++
	s.stopped = true
	return nil
}

// Destroy implements runtime.Sandbox; idempotent.
func (s *Sandbox) Destroy(context.Context) error {
	s.rt.mu.Lock()
	defer s.rt.mu.Unlock()
	s.stopped = true
	if s.rt.sandboxes[s.id] == s {
		delete(s.rt.sandboxes, s.id)
		s.rt.destroys[s.id]++
	}
	return nil
}
