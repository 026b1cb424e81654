// Package persist carries a sandbox's work from one sandbox to the next: it
// prepares /workspace as a clone of the account's repository, and after a
// run commits and pushes what changed and captures the sandbox's writable
// layer as a snapshot in blob storage, which becomes the account's snapshot
// that new sandboxes start from.
//
// Snapshots form chains: a sandbox restored from snapshot P captures only
// its own writable layer, recorded with parent P. Past MaxDepth the chain is
// flattened into one layer, so restores stay quick. Snapshots that nothing
// refers to any more (no environment, no child, no active sandbox) are
// deleted with their blobs, unless another snapshot shares the blob.
//
// Git inside the sandbox authenticates to http://sandboxd.internal with the
// sandbox's own key through a credential helper given in the environment
// (see GitEnv), so no secret is ever written to the repository or to a
// snapshot. Sandboxes push only there: the forge (GitHub) is reached from
// the host alone (Mirror), with a token no sandbox ever holds.
package persist

import (
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// HomeURL is the server as sandboxes reach it.
const HomeURL = "http://sandboxd.internal"

// Options configure a Service.
type Options struct {
	Store *store.Store
	Blobs blob.Store
	Repos *repo.Manager
	// BaseDir is the base root filesystem, needed to flatten chains.
	BaseDir string
	// TempDir holds scratch space for flattening.
	TempDir string
	// LayerBytes is the sandboxes' disk limit: a flatten's scratch space and
	// result are bounded by it, and TempDir must have that much free
	// first. 0 is unlimited.
	LayerBytes int64
	// SnapshotQuota is how many bytes of snapshot blobs one account may
	// store; a capture that would pass it is refused before its blob is
	// stored. 0 is unlimited.
	SnapshotQuota int64
	// MaxDepth is the longest chain of layers kept (default 8).
	MaxDepth int
	// TTL is how long the account's snapshot stays valid (default 7 days).
	TTL time.Duration
	// Mirror, when set, keeps a forge (GitHub) repository per account in
	// step with the account's repository after every run.
	Mirror *forge.Mirror
	Logger *slog.Logger
	// Now is the clock of expiries and of the collector's grace period
	// (default time.Now).
	Now func() time.Time
}

// Service implements sandbox.Persistence.
type Service struct {
	opts Options
	st   *store.Store
	log  *slog.Logger

	// captures serializes the captures of one account, so two sandboxes
	// cannot both pass the snapshot quota check with the same room.
	mu       sync.Mutex
	captures map[string]*sync.Mutex
	// prepared is the workspace preparation of each sandbox (see Prepare).
	prepared map[string]*preparation
	// clones are the accounts' clone archives (fastPrepare), and
	// cloneBuilds the archives being built.
	clones      *cloneCache
	cloneBuilds singleflight.Group
}

var (
	_ sandbox.Persistence = (*Service)(nil)
	_ sandbox.LayerSource = (*Service)(nil)
	_ sandbox.ForgeMirror = (*Service)(nil)
)

// New returns a Service.
func New(opts Options) (*Service, error) {
	if opts.Store == nil || opts.Blobs == nil || opts.Repos == nil {
		return nil, errors.New("persist: store, blobs and repos are required")
	}
	if opts.MaxDepth <= 0 {
		opts.MaxDepth = 8
	}
	if opts.TTL <= 0 {
		opts.TTL = 7 * 24 * time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.TempDir == "" {
		opts.TempDir = os.TempDir()
	}
	return &Service{opts: opts, st: opts.Store, log: opts.Logger, captures: map[string]*sync.Mutex{}, prepared: map[string]*preparation{}, clones: newCloneCache()}, nil
}
