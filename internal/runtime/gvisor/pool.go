package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/host"
)

// pool keeps started sandboxes of the warm base with an empty writable
// layer. Handing one out is a rename: write its meta and claim its id.
type pool struct {
	r *Runtime

	mu sync.Mutex
	// size is what the pool keeps when full: Options.WarmPool, then what
	// its caller sets as demand changes (SetWarmSize).
	size      int
	ready     []*sandbox
	starting  int
	hits      uint64 // creates handed a warm sandbox
	misses    uint64 // creates that fit but found none ready
	made      uint64 // warm sandboxes started
	failed    uint64
	discarded uint64 // destroyed unused: the pool shrank
	closed    bool
	kick      chan struct{}
	done      chan struct{}
	cancel    context.CancelFunc
}

func newPool(r *Runtime, size int) *pool {
	ctx, cancel := context.WithCancel(r.Context())
	p := &pool{r: r, size: size, kick: make(chan struct{}, 1), done: make(chan struct{}), cancel: cancel}
	go p.fill(ctx)
	return p
}

// warmSpec is what pool sandboxes are made of.
func (p *pool) warmSpec() runtime.Spec {
	return runtime.Spec{
		BaseDir: p.r.opts.WarmBaseDir, BaseImage: p.r.opts.WarmBaseImage,
		Limits: p.r.Limits(runtime.Limits{}), Hostname: "sandbox",
	}
}

// fits says whether a warm sandbox can serve spec: the built-in image (no
// custom template, whose pools are runtime.Pooler's), same base, default
// limits (they are fixed at start: the disk image and RLIMIT_NPROC), no
// custom hostname, and nothing to restore (restored layers are overlay
// lowers, which cannot be added under a mounted overlay).
func (p *pool) fits(spec runtime.Spec) bool {
	w := p.warmSpec()
	return spec.Template == "" && len(spec.Layers) == 0 && spec.Network == nil && len(spec.Volumes) == 0 && spec.BaseDir == w.BaseDir && spec.Limits == w.Limits && spec.Hostname == w.Hostname
}

// take returns a warm sandbox or nil, and asks for a replacement.
func (p *pool) take() *sandbox {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	if len(p.ready) == 0 {
		p.misses++
		return nil
	}
	s := p.ready[0]
	p.ready = p.ready[1:]
	p.hits++
	return s
}

// stats are the warm pool's figures (runtime.Pooler.PoolStats).
func (p *pool) stats() runtime.PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return runtime.PoolStats{Size: p.size, Ready: len(p.ready), Starting: p.starting, Hits: p.hits, Misses: p.misses, Started: p.made, Failed: p.failed, Discarded: p.discarded}
}

// setSize makes the pool keep n sandboxes: more are started in the
// background, one at a time; the surplus ready ones (the oldest first)
// are destroyed.
func (p *pool) setSize(n int) {
	p.mu.Lock()
	p.size = max(0, n)
	var drop []*sandbox
	if extra := len(p.ready) - p.size; extra > 0 {
		drop = append(drop, p.ready[:extra]...)
		p.ready = append([]*sandbox(nil), p.ready[extra:]...)
		p.discarded += uint64(extra)
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	if len(drop) > 0 {
		go func() {
			for _, s := range drop {
				_ = s.Destroy(context.Background())
			}
		}()
	}
}

// SetWarmSize implements runtime.WarmSizer: the warm pool keeps n
// sandboxes (none without a warm pool).
func (r *Runtime) SetWarmSize(n int) {
	if r.pool != nil {
		r.pool.setSize(n)
	}
}

// WarmReady is how many warm sandboxes wait (for tests and the bench).
func (r *Runtime) WarmReady() int {
	p := r.pool
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ready)
}

func (p *pool) fill(ctx context.Context) {
	defer close(p.done)
	backoff := host.Backoff{First: time.Second, Max: time.Minute}
	for {
		p.mu.Lock()
		need := p.size - len(p.ready)
		if need > 0 {
			p.starting = 1
		}
		p.mu.Unlock()
		if need > 0 {
			s, err := p.r.createCold(ctx, p.warmSpec(), "")
			p.mu.Lock()
			p.starting = 0
			p.mu.Unlock()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				p.mu.Lock()
				p.failed++
				p.mu.Unlock()
				p.r.log.Warn("warm pool: start sandbox", "err", err)
				if !backoff.Wait(ctx) {
					return
				}
				continue
			}
			backoff.Reset()
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				_ = s.Destroy(context.Background())
				return
			}
			p.ready = append(p.ready, s)
			p.made++
			p.mu.Unlock()
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
	}
}

// close stops filling and destroys the warm sandboxes.
func (p *pool) close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	<-p.done
	p.mu.Lock()
	ready := p.ready
	p.ready = nil
	p.mu.Unlock()
	var errs []error
	for _, s := range ready {
		errs = append(errs, s.Destroy(context.Background()))
	}
	return errors.Join(errs...)
}

// assign turns a warm sandbox into spec's sandbox.
func (s *sandbox) assign(spec runtime.Spec, link string) error {
	m := s.Meta()
	if err := os.Symlink(filepath.Join("..", "sandboxes", m.CID), link); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create sandbox %s: %w", spec.ID, runtime.ErrExists)
		}
		return err
	}
	s.Mu.Lock()
	s.M.ID, s.M.Env, s.M.HomeSocket, s.M.BaseImage = spec.ID, spec.Env, spec.HomeSocket, spec.BaseImage
	s.M.Created = time.Now().UTC()
	m = s.M
	s.Mu.Unlock()
	if err := writeMeta(s.Dir, m); err != nil {
		_ = os.Remove(link)
		return err
	}
	return nil
}
