// Package repo owns the accounts' git repositories: one bare repository per
// account at <root>/<account-id>.git, created on first need with the
// branch main. It lists trees, reads files (following git submodules into
// other repositories hosted here), commits files without a worktree, and
// serves the repositories over git smart HTTP.
//
// Invariants:
//   - Account ids are canonical (lowercase) UUIDs; nothing else ever becomes
//     a path, so an id cannot escape the root.
//   - A repository without commits is valid: its tree is empty and every
//     read is ErrNotFound.
//   - Branches move only by compare-and-swap (git update-ref with the old
//     value), the same lock protocol git receive-pack uses, so a commit made
//     here and a concurrent push never lose one another. Commits made here
//     are also serialised per repository by a mutex, which spares them
//     retries among themselves.
//   - Objects are written with go-git (blobs streamed, never held whole in
//     memory); refs, tree listings and smart HTTP use the git CLI, which
//     shares git's locking and is faster at listing.
//   - Everything in a repository is hostile: files are read whole only
//     below a limit checked from the object's header, tree listings stop
//     at a limit while git lists them, and writes (commits here, pushes
//     through the git server) are refused before they would pass the
//     account's repository quota (Limits).
//   - A submodule resolves only into a repository hosted here, named by a
//     URL relative to its parent ("../<id>.git") or under one of the
//     server's own URLs (".../git/<id>.git"), and only when the account
//     that reads or writes may use that repository (Options.Access), for
//     writing by the same rule as git push.
package repo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/storage/filesystem"
	"github.com/google/uuid"
)

// MainBranch is the branch every repository starts with and the one the
// API reads.
const MainBranch = "main"

// Errors of the package; wrapped with context, matched with errors.Is.
var (
	// ErrNoRepository: the account has no repository yet.
	ErrNoRepository = errors.New("no repository")
	// ErrNotFound: the path, branch or object does not exist (or lies in a
	// submodule that cannot be followed).
	ErrNotFound = errors.New("not found")
	// ErrInvalidAccount: the account id is not a canonical UUID.
	ErrInvalidAccount = errors.New("invalid account id")
	// ErrInvalidPath: a path to write is malformed or collides with the
	// tree (a file where a directory is, or the reverse).
	ErrInvalidPath = errors.New("invalid path")
	// ErrConflict: the branch kept moving under a commit; nothing was lost,
	// the commit was not made.
	ErrConflict = errors.New("branch moved concurrently")
)

// Use is what a submodule is followed for.
type Use int

const (
	// UseRead follows a submodule to read a file.
	UseRead Use = iota
	// UseWrite follows a submodule to commit into its repository.
	UseWrite
)

// SubmoduleAccess decides whether a submodule followed on behalf of account
// may lead into owner's repository, to read it or to commit to it. Writing
// must follow the same rule as git push (auth.MayWrite): an account that
// may read a repository (an organization's member) may not thereby write it.
type SubmoduleAccess interface {
	MayUseRepository(ctx context.Context, account, owner string, use Use) (bool, error)
}

// AccessFunc adapts a function to SubmoduleAccess.
type AccessFunc func(ctx context.Context, account, owner string, use Use) (bool, error)

// MayUseRepository calls f.
func (f AccessFunc) MayUseRepository(ctx context.Context, account, owner string, use Use) (bool, error) {
	return f(ctx, account, owner, use)
}

// Options configure a Manager.
type Options struct {
	// Root is the directory holding the repositories (<data-dir>/repos).
	Root string
	// LocalURLs are the base URLs under which this server is reachable
	// (e.g. "http://127.0.0.1:8080", "http://sandboxd.internal"); submodule
	// URLs under them name repositories hosted here.
	LocalURLs []string
	// Access decides submodules into other accounts' repositories; nil
	// allows only the reading account's own repository.
	Access SubmoduleAccess
	// Git is the git executable (default "git" from PATH).
	Git string
	// TreeCacheEntries bounds the cache of tree listings (default 32).
	TreeCacheEntries int
	// Limits bound what the server reads and accepts (zero fields take
	// the defaults, negative ones mean unlimited): MaxReadBytes is the
	// largest file ReadFile returns (ErrTooLarge beyond), TreeMaxEntries
	// and TreeMaxPathBytes cut tree listings, QuotaBytes is the disk space
	// one account's repository may take (commits and pushes that would
	// pass it are refused), MaxPushBytes and MaxPushObjects bound one push.
	Limits Limits
	// Shared, in a cluster, is where the nodes publish the repositories
	// they all serve (see shared.go); nil: this node's alone.
	Shared Shared
	Logger *slog.Logger
}

// Manager manages the repositories under one root. It is safe for
// concurrent use; several Managers (or processes) may share a root, since
// branch updates are compare-and-swap.
type Manager struct {
	root      string
	git       string
	local     []localURL
	access    SubmoduleAccess
	log       *slog.Logger
	treeCache *lru
	limits    Limits
	shared    Shared

	mu    sync.Mutex
	locks map[string]*sync.Mutex

	// beforeUpdateRef, when set (by tests), runs just before a commit moves
	// a branch: the moment a concurrent push would have to land to race it.
	beforeUpdateRef func(repoPath string)
}

// New returns a Manager for opts.Root, creating the directory.
func New(opts Options) (*Manager, error) {
	if opts.Root == "" {
		return nil, errors.New("repo: no root directory")
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("repo: resolve root %s: %w", opts.Root, err)
	}
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, fmt.Errorf("repo: create root %s: %w", root, err)
	}
	if opts.Git == "" {
		opts.Git = "git"
	}
	gitPath, err := exec.LookPath(opts.Git)
	if err != nil {
		return nil, fmt.Errorf("repo: find git: %w", err)
	}
	if opts.TreeCacheEntries <= 0 {
		opts.TreeCacheEntries = 32
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Manager{
		root:      root,
		git:       gitPath,
		access:    opts.Access,
		log:       opts.Logger,
		treeCache: newLRU(opts.TreeCacheEntries),
		limits:    opts.Limits.withDefaults(),
		locks:     map[string]*sync.Mutex{},
		shared:    opts.Shared,
	}
	if err := m.installHooks(); err != nil {
		return nil, fmt.Errorf("repo: %w", err)
	}
	for _, u := range opts.LocalURLs {
		l, err := parseLocalURL(u)
		if err != nil {
			return nil, fmt.Errorf("repo: local URL %q: %w", u, err)
		}
		m.local = append(m.local, l)
	}
	return m, nil
}

// Root is the directory holding the repositories.
func (m *Manager) Root() string { return m.root }

// CanonicalID returns id in its canonical lowercase form, or
// ErrInvalidAccount.
func CanonicalID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		return "", fmt.Errorf("%w: %q", ErrInvalidAccount, id)
	}
	return u.String(), nil
}

// Path is where account's repository lives (whether or not it exists).
func (m *Manager) Path(accountID string) (string, error) {
	id, err := CanonicalID(accountID)
	if err != nil {
		return "", err
	}
	return filepath.Join(m.root, id+".git"), nil
}

// Exists reports whether account has a repository.
func (m *Manager) Exists(ctx context.Context, accountID string) (bool, error) {
	p, err := m.Path(accountID)
	if err != nil {
		return false, err
	}
	if err := m.sync(ctx, accountID); err != nil {
		return false, err
	}
	return isRepo(p)
}

// Synced is Path for a caller that reads the repository itself (a mirror
// push): in a cluster the copy here is brought up to date first.
func (m *Manager) Synced(ctx context.Context, accountID string) (string, error) {
	p, err := m.Path(accountID)
	if err != nil {
		return "", err
	}
	return p, m.sync(ctx, accountID)
}

func isRepo(p string) (bool, error) {
	fi, err := os.Stat(filepath.Join(p, "HEAD"))
	switch {
	case err == nil:
		return fi.Mode().IsRegular(), nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("stat repository %s: %w", p, err)
}

// existing returns the path of account's repository (brought up to date
// in a cluster), or ErrNoRepository.
func (m *Manager) existing(ctx context.Context, accountID string) (string, error) {
	p, err := m.Path(accountID)
	if err != nil {
		return "", err
	}
	if err := m.sync(ctx, accountID); err != nil {
		return "", err
	}
	ok, err := isRepo(p)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("repository of %s: %w", accountID, ErrNoRepository)
	}
	return p, nil
}

// Ensure creates account's repository if it does not exist and returns its
// path. Creation is atomic: the repository is initialised aside and renamed
// into place, so nobody sees a half-made one. In a cluster it is created
// once for all the nodes.
func (m *Manager) Ensure(ctx context.Context, accountID string) (string, error) {
	p, err := m.existing(ctx, accountID)
	if err == nil || !errors.Is(err, ErrNoRepository) {
		return p, err
	}
	if p, err = m.Path(accountID); err != nil {
		return "", err
	}
	err = m.change(ctx, accountID, func(ctx context.Context, p string) error {
		if ok, err := isRepo(p); err != nil || ok {
			if err == nil {
				err = errUnchanged
			}
			return err
		}
		return m.initRepo(ctx, accountID, p)
	})
	return p, err
}

// initRepo creates an empty repository at p.
func (m *Manager) initRepo(ctx context.Context, accountID, p string) error {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(m.root, ".init-"+filepath.Base(p)+"-"+hex.EncodeToString(rnd[:]))
	defer os.RemoveAll(tmp)
	if _, err := m.run(ctx, "", nil, "init", "--quiet", "--bare", "--initial-branch="+MainBranch, tmp); err != nil {
		return fmt.Errorf("create repository of %s: %w", accountID, err)
	}
	for _, kv := range [][2]string{
		// A reflog on a bare repository makes every branch move recoverable.
		{"core.logAllRefUpdates", "true"},
		// Submodule clones fetch the recorded commit by id.
		{"uploadpack.allowReachableSHA1InWant", "true"},
		// Pack sooner than git's default 6700 loose objects: commits made
		// here write loose objects, and tree listings with sizes are
		// several times slower over loose objects (see maybeGC).
		{"gc.auto", "2000"},
	} {
		if _, err := m.run(ctx, tmp, nil, "config", kv[0], kv[1]); err != nil {
			return fmt.Errorf("configure repository of %s: %w", accountID, err)
		}
	}
	if err := os.Rename(tmp, p); err != nil {
		// Someone else created it meanwhile: theirs is as good as ours.
		if ok, _ := isRepo(p); ok {
			return nil
		}
		return fmt.Errorf("create repository of %s: %w", accountID, err)
	}
	m.log.InfoContext(ctx, "repository created", "account", accountID, "path", p)
	return nil
}

// Delete removes account's repository from disk (on every node, in a
// cluster); deleting a missing one is not an error.
func (m *Manager) Delete(ctx context.Context, accountID string) error {
	return m.change(ctx, accountID, func(ctx context.Context, p string) error {
		l := m.lock(p)
		l.Lock()
		defer l.Unlock()
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			if m.shared == nil {
				return errUnchanged
			}
			return nil // published as deleted all the same
		}
		// Renamed first (removeLocal) so that a concurrent reader sees
		// either the whole repository or none of it.
		if err := m.removeLocal(ctx, accountID, p); err != nil {
			return err
		}
		m.log.InfoContext(ctx, "repository deleted", "account", accountID)
		return nil
	})
}

// Head returns the commit branch points at in account's repository, or ""
// when the branch does not exist (a repository without commits).
func (m *Manager) Head(ctx context.Context, accountID, branch string) (string, error) {
	p, err := m.existing(ctx, accountID)
	if err != nil {
		return "", err
	}
	st := openStorage(p)
	defer st.Close()
	h, err := branchHead(st, branch)
	if err != nil || h.IsZero() {
		return "", err
	}
	return h.String(), nil
}

// lock returns the mutex serialising commits to the repository at p.
func (m *Manager) lock(p string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.locks[p]
	if !ok {
		l = &sync.Mutex{}
		m.locks[p] = l
	}
	return l
}

// openStorage opens a go-git storage on the bare repository at p. It is
// opened per operation: pushes add and repack packfiles, and a storage kept
// open would miss them.
func openStorage(p string) *filesystem.Storage {
	return filesystem.NewStorage(osfs.New(p, osfs.WithBoundOS()), cache.NewObjectLRU(16<<20))
}

// branchHead returns the commit of branch, or the zero hash when the
// branch does not exist.
func branchHead(st *filesystem.Storage, branch string) (plumbing.Hash, error) {
	ref, err := st.Reference(plumbing.NewBranchReferenceName(branch))
	if errors.Is(err, plumbing.ErrReferenceNotFound) {
		return plumbing.ZeroHash, nil
	}
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("read branch %s: %w", branch, err)
	}
	return ref.Hash(), nil
}

// gitSettings make git ignore system and user configuration, so that the
// server behaves the same on every host.
var gitSettings = []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "LC_ALL=C"}

// gitEnv is the environment of the git commands the server runs: its own,
// without variables that would point git elsewhere, plus gitSettings.
func gitEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GIT_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, gitSettings...)
	return append(env, extra...)
}

// run runs git with args in the repository dir ("" for none) and returns
// its standard output.
func (m *Manager) run(ctx context.Context, dir string, stdin io.Reader, args ...string) ([]byte, error) {
	if dir != "" {
		args = append([]string{"--git-dir=" + dir}, args...)
	}
	cmd := exec.CommandContext(ctx, m.git, args...)
	cmd.Env = gitEnv("GIT_COMMITTER_NAME=sandboxd", "GIT_COMMITTER_EMAIL=sandboxd@localhost")
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &GitError{Args: args, Stderr: strings.TrimSpace(stderr.String()), Err: err}
	}
	return stdout.Bytes(), nil
}

// GitError is a failed git command.
type GitError struct {
	Args   []string
	Stderr string
	Err    error
}

func (e *GitError) Error() string {
	return fmt.Sprintf("git %s: %v: %s", strings.Join(e.Args, " "), e.Err, e.Stderr)
}

func (e *GitError) Unwrap() error { return e.Err }
