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
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/snapshot"
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
}

// preparation is the state of a sandbox's workspace; mu serialises the git
// work in it.
type preparation struct {
	mu   sync.Mutex
	done bool
	err  error
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
	return &Service{opts: opts, st: opts.Store, log: opts.Logger, captures: map[string]*sync.Mutex{}, prepared: map[string]*preparation{}}, nil
}

// GitEnv is the environment that makes git inside a sandbox authenticate to
// sandboxd with the sandbox's key (read from RECOUP_API_KEY when git runs)
// and sign commits as the sandbox. It holds no credential for any other
// host: pushes to GitHub happen on the host (see Mirror).
func GitEnv(sandboxID string) []string {
	cfg := [][2]string{
		{"credential." + HomeURL + ".helper", `!f() { test "$1" = get && echo username=sandbox && echo "password=$RECOUP_API_KEY"; }; f`},
		{"user.name", "sandboxd"},
		{"user.email", sandboxID + "@sandboxd.internal"},
		{"init.defaultBranch", "main"},
		{"safe.directory", "*"},
	}
	env := []string{fmt.Sprintf("GIT_CONFIG_COUNT=%d", len(cfg))}
	for i, kv := range cfg {
		env = append(env, fmt.Sprintf("GIT_CONFIG_KEY_%d=%s", i, kv[0]), fmt.Sprintf("GIT_CONFIG_VALUE_%d=%s", i, kv[1]))
	}
	return env
}

// RepoURL is the account's repository as sandboxes reach it.
func RepoURL(accountID string) string {
	return HomeURL + repo.GitPathPrefix + accountID + ".git"
}

// prepareScript makes /workspace a clone of the account's repository: a
// fresh sandbox clones; one restored from a snapshot fetches and
// fast-forwards. It is idempotent and leaves diverged work alone.
const prepareScript = `set -e
if ! command -v git >/dev/null 2>&1; then echo "sandboxd: git is not installed; /workspace is not a clone" >&2; exit 0; fi
mkdir -p /workspace
cd /workspace
if [ ! -d .git ]; then
  git init -q -b main .
  git remote add origin "$1"
fi
git fetch -q origin
if git rev-parse -q --verify refs/remotes/origin/main >/dev/null; then
  if git rev-parse -q --verify HEAD >/dev/null; then
    git merge -q --ff-only origin/main || echo "sandboxd: /workspace has diverged from main; left as it is" >&2
  else
    git checkout -q -B main origin/main
  fi
  git branch -q --set-upstream-to=origin/main main 2>/dev/null || true
fi
if [ -f .gitmodules ]; then
  git submodule -q update --init --recursive || echo "sandboxd: could not update the submodules" >&2
  # Organization repositories start every piece of work at their latest main.
  git submodule -q foreach 'git fetch -q origin && git reset -q --hard origin/main' || echo "sandboxd: could not reset the submodules" >&2
fi
`

// Prepare implements sandbox.Persistence: it readies the sandbox's
// /workspace as a clone of the account's repository, once, or again when
// asked (to pick up what was pushed since). Calls for one sandbox take
// turns; after a restart it runs again (it is idempotent). The workspace
// hook starts it as soon as a sandbox runs (see Hooks).
func (s *Service) Prepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, again bool) error {
	return s.prepareOnce(ctx, s.preparation(sb.ID), sb, rsb, again)
}

// preparation is the memo of sandbox id's workspace, made on first use.
func (s *Service) preparation(id string) *preparation {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.prepared[id]
	if !ok {
		p = &preparation{}
		s.prepared[id] = p
	}
	return p
}

// prepareOnce prepares the workspace under p's lock, once unless again.
func (s *Service) prepareOnce(ctx context.Context, p *preparation, sb store.Sandbox, rsb runtime.Sandbox, again bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done && !again {
		return p.err
	}
	p.err, p.done = s.prepare(ctx, sb, rsb), true
	if p.err != nil {
		s.log.Warn("prepare workspace", "sandbox_id", sb.ID, "err", p.err)
	}
	return p.err
}

// markPrepared records that sandbox id's workspace needs no preparing (a
// fork's, copied from its prepared parent).
func (s *Service) markPrepared(id string) {
	p := s.preparation(id)
	p.mu.Lock()
	p.done, p.err = true, nil
	p.mu.Unlock()
}

// forgetPrepared drops what Prepare remembers of sandbox id (it ended).
func (s *Service) forgetPrepared(id string) {
	s.mu.Lock()
	delete(s.prepared, id)
	s.mu.Unlock()
}

func (s *Service) prepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) error {
	if _, err := s.opts.Repos.Ensure(ctx, sb.AccountID); err != nil {
		return fmt.Errorf("ensure repository of %s: %w", sb.AccountID, err)
	}
	if _, err := runScript(ctx, rsb, prepareScript, RepoURL(sb.AccountID)); err != nil {
		return fmt.Errorf("prepare /workspace of %s: %w", sb.ID, err)
	}
	return nil
}

// saveScript commits everything in /workspace and pushes it to main, or to
// sandbox/<id> when main moved on meanwhile, so work is never lost. It
// prints "pushed <branch>".
const saveScript = `set -e
command -v git >/dev/null 2>&1 || exit 0
cd /workspace 2>/dev/null || exit 0
[ -d .git ] || exit 0
git add -A
git diff --cached --quiet || git commit -q -m "$1"
git rev-parse -q --verify HEAD >/dev/null || exit 0
if git push -q origin HEAD:refs/heads/main 2>/dev/null; then
  echo "pushed main"
else
  git push -q -f origin "HEAD:refs/heads/sandbox/$2"
  echo "pushed sandbox/$2"
fi
`

// AfterRun implements sandbox.Persistence.
func (s *Service) AfterRun(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, run store.Run) (runs.Saved, error) {
	var saved runs.Saved
	out, err := runScript(ctx, rsb, saveScript, "sandboxd: run "+run.ID, sb.ID)
	if err != nil {
		// The snapshot still keeps the work; say what went wrong, without
		// what the host said (its paths stay in the log).
		saved.GitError = errdefs.Message(err, "the commit and push could not be run (details are in the server log)")
		s.log.Warn("commit and push of run", "run_id", run.ID, "err", err)
	}
	if b, ok := strings.CutPrefix(strings.TrimSpace(out), "pushed "); ok {
		saved.Branch = b
	}
	if s.opts.Mirror != nil {
		s.mirror(ctx, sb.AccountID)
	}
	snap, err := s.Capture(ctx, sb, rsb)
	if err != nil {
		return saved, err
	}
	saved.SnapshotID = snap.ID
	// Capture made it the account's snapshot: its row says until when.
	if env, err := s.st.GetEnvironment(ctx, sb.AccountID); err == nil {
		saved.SnapshotExpiresAt = env.ExpiresAt
	}
	return saved, nil
}

// mirror brings the account's forge repository up to date: the one the
// account named with PATCH github_repo when it is on the forge, else the
// mirror sandboxd keeps for it, whose URL becomes the account's
// github_repo. It is best effort: the work is safe here either way.
func (s *Service) mirror(ctx context.Context, accountID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	bare, err := s.opts.Repos.Synced(ctx, accountID)
	if err != nil {
		s.log.Warn("mirror: repository path", "account_id", accountID, "err", err)
		return
	}
	env, err := s.st.GetEnvironment(ctx, accountID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("mirror: load environment", "account_id", accountID, "err", err)
		return
	}
	if env.GithubRepo != nil && *env.GithubRepo != "" && s.opts.Mirror.OwnsRepo(accountID, *env.GithubRepo) == nil {
		// Checked again here, not only when it was set: a row written
		// before the check existed must not make the token push to a
		// repository the account does not own.
		if _, err := s.opts.Mirror.SyncURL(ctx, bare, *env.GithubRepo); err == nil || !errors.Is(err, forge.ErrNotOnForge) {
			if err != nil {
				s.log.Warn("mirror: push to the account's repository", "account_id", accountID, "err", err)
			}
			return
		}
	}
	repoInfo, err := s.opts.Mirror.Sync(ctx, accountID, bare)
	if err != nil {
		s.log.Warn("mirror: sync", "account_id", accountID, "err", err)
		if repoInfo.HTMLURL == "" {
			return
		}
	}
	if err := s.setRepoURL(ctx, accountID, repoInfo.HTMLURL); err != nil {
		s.log.Warn("mirror: record repository URL", "account_id", accountID, "err", err)
	}
}

// OwnsRepo implements sandbox.ForgeMirror: see forge.Mirror.OwnsRepo.
func (s *Service) OwnsRepo(accountID, url string) error {
	return s.opts.Mirror.OwnsRepo(accountID, url)
}

// MirrorNow pushes the account's repository to its mirror on the forge at
// once (the coding agent's branch, before its pull request is opened) and
// returns the mirror. The push runs here on the host: no sandbox holds the
// forge's token.
func (s *Service) MirrorNow(ctx context.Context, accountID string) (forge.Repo, error) {
	if s.opts.Mirror == nil {
		return forge.Repo{}, errors.New("no forge is configured")
	}
	bare, err := s.opts.Repos.Synced(ctx, accountID)
	if err != nil {
		return forge.Repo{}, fmt.Errorf("repository of %s: %w", accountID, err)
	}
	r, err := s.opts.Mirror.Sync(ctx, accountID, bare)
	if r.HTMLURL != "" {
		if err := s.setRepoURL(ctx, accountID, r.HTMLURL); err != nil {
			s.log.Warn("mirror: record repository URL", "account_id", accountID, "err", err)
		}
	}
	return r, err
}

// Snapshot implements sandbox.Persistence.
func (s *Service) Snapshot(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) (string, error) {
	snap, err := s.Capture(ctx, sb, rsb)
	return snap.ID, err
}

// Initialize implements sandbox.Persistence: an account's repository
// without commits gets a README, so it can be cloned and used as a
// submodule.
func (s *Service) Initialize(ctx context.Context, account store.Account) error {
	if _, err := s.opts.Repos.Ensure(ctx, account.ID); err != nil {
		return err
	}
	head, err := s.opts.Repos.Head(ctx, account.ID, repo.MainBranch)
	if err != nil || head != "" {
		return err
	}
	readme := fmt.Sprintf("# %s\n\nThe repository of %s on sandboxd.\n", account.Name, account.Slug)
	_, _, err = s.opts.Repos.CommitFiles(ctx, account.ID, repo.MainBranch,
		[]repo.File{repo.BytesFile("README.md", []byte(readme))}, "Initialize repository", repo.DefaultAuthor)
	if errors.Is(err, repo.ErrConflict) {
		return nil // someone else initialised it meanwhile
	}
	return err
}

// runScript runs a shell script in the sandbox with args as $1, $2, ...
func runScript(ctx context.Context, rsb runtime.Sandbox, script string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	res, err := rsb.Exec(ctx, runtime.ExecRequest{
		Cmd:    append([]string{"/bin/sh", "-c", script, "sandboxd"}, args...),
		Cwd:    "/",
		Stdout: &stdout, Stderr: &stderr,
		Timeout: 5 * time.Minute,
	})
	if err != nil {
		return stdout.String(), err
	}
	if res.ExitCode != 0 {
		// The script's own failure, said by git inside the sandbox: the
		// user's to see. Exec's errors above come from the host (they may
		// name its paths) and stay in the log.
		return stdout.String(), errdefs.New(nil, fmt.Sprintf("exit status %d: %s", res.ExitCode, strings.TrimSpace(lastLines(stderr.String(), 5))))
	}
	return stdout.String(), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Capture snapshots the sandbox's writable layer, records it (flattening a
// chain grown past MaxDepth) and makes it the account's snapshot.
func (s *Service) Capture(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) (store.Snapshot, error) {
	var parent *store.Snapshot
	if sb.SnapshotID != "" {
		p, err := s.st.GetSnapshot(ctx, sb.SnapshotID)
		if err != nil {
			return store.Snapshot{}, fmt.Errorf("load parent snapshot: %w", err)
		}
		parent = &p
	}
	unlock := s.lockAccount(sb.AccountID)
	defer unlock()
	room, err := s.snapshotRoom(ctx, sb.AccountID)
	if err != nil {
		return store.Snapshot{}, err
	}
	pr, pw := io.Pipe()
	manifest := make(chan snapshot.Manifest, 1)
	go func() {
		m, err := rsb.Snapshot(ctx, pw)
		manifest <- m
		pw.CloseWithError(err)
	}()
	info, err := s.opts.Blobs.Put(ctx, s.quotaReader(pr, room))
	pr.CloseWithError(err)
	m := <-manifest
	if err != nil {
		return store.Snapshot{}, fmt.Errorf("store snapshot of %s: %w", sb.ID, userFacing(err))
	}
	room -= info.Size
	snap := store.Snapshot{
		ID: store.NewID("snap_"), AccountID: sb.AccountID, BaseImage: m.BaseImage,
		BlobKey: info.Key, Size: info.Size, Depth: 1, SandboxID: sb.ID,
		CreatedAt: s.opts.Now(),
	}
	if parent != nil {
		snap.ParentID, snap.Depth = parent.ID, parent.Depth+1
	}
	layerKey := snap.BlobKey
	if snap.Depth > s.opts.MaxDepth {
		flat, err := s.flatten(ctx, snap, parent, room)
		if err != nil {
			s.dropBlob(ctx, layerKey)
			return store.Snapshot{}, userFacing(err)
		}
		snap = flat
	}
	if err := s.st.CreateSnapshot(ctx, &snap); err != nil {
		return store.Snapshot{}, fmt.Errorf("record snapshot: %w", err)
	}
	if snap.BlobKey != layerKey {
		// The flattened blob holds the layer: nothing refers to it alone.
		s.dropBlob(ctx, layerKey)
	}
	if err := s.setEnvironment(ctx, sb.AccountID, snap.ID); err != nil {
		return store.Snapshot{}, err
	}
	s.log.Info("snapshot taken", "sandbox_id", sb.ID, "snapshot_id", snap.ID, "bytes", snap.Size, "depth", snap.Depth, "files", m.Entries)
	s.collect(ctx)
	return snap, nil
}

// lockAccount serializes the captures of one account.
func (s *Service) lockAccount(accountID string) func() {
	s.mu.Lock()
	l, ok := s.captures[accountID]
	if !ok {
		l = &sync.Mutex{}
		s.captures[accountID] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// snapshotRoom is how many bytes of snapshot blobs the account may still
// store (-1: unlimited), after collecting what nothing refers to any more
// so that replaced and expired snapshots do not count.
func (s *Service) snapshotRoom(ctx context.Context, accountID string) (int64, error) {
	if s.opts.SnapshotQuota <= 0 {
		return -1, nil
	}
	s.collect(ctx)
	snaps, err := s.st.ListSnapshots(ctx, accountID)
	if err != nil {
		return 0, fmt.Errorf("list snapshots of %s: %w", accountID, err)
	}
	var used int64
	seen := map[string]bool{}
	for _, sn := range snaps {
		if !seen[sn.BlobKey] {
			seen[sn.BlobKey] = true
			used += sn.Size
		}
	}
	room := s.opts.SnapshotQuota - used
	if room <= 0 {
		return 0, s.quotaError(used)
	}
	return room, nil
}

func (s *Service) quotaError(used int64) error {
	return errdefs.New(nil, fmt.Sprintf("the account's snapshots would use more than its snapshot storage quota of %d MiB (%d MiB are stored); delete the environment (DELETE /api/sandboxes) or store less outside /workspace",
		s.opts.SnapshotQuota>>20, used>>20))
}

// quotaReader passes at most room bytes of r (all of it when room < 0)
// and fails with the quota error past that, so the blob is never stored.
func (s *Service) quotaReader(r io.Reader, room int64) io.Reader {
	if room < 0 {
		return r
	}
	return &quotaReader{r: r, left: room, err: func() error { return s.quotaError(s.opts.SnapshotQuota - room) }}
}

type quotaReader struct {
	r    io.Reader
	left int64
	err  func() error
}

func (q *quotaReader) Read(p []byte) (int, error) {
	if q.left <= 0 {
		var one [1]byte
		n, err := q.r.Read(one[:])
		if n > 0 {
			return 0, q.err()
		}
		return 0, err
	}
	if int64(len(p)) > q.left {
		p = p[:q.left]
	}
	n, err := q.r.Read(p)
	q.left -= int64(n)
	return n, err
}

// userFacing keeps only the user's message of err (and drops the context
// wrapped around it below, which may name host paths, such as the spool
// file of a refused blob) when it has one.
func userFacing(err error) error {
	var ue *errdefs.Error
	if errors.As(err, &ue) {
		return errdefs.Wrap(nil, err, ue.Msg)
	}
	return err
}

// dropBlob deletes a blob no snapshot refers to; best effort.
func (s *Service) dropBlob(ctx context.Context, key string) {
	if err := s.deleteBlobIfUnused(context.WithoutCancel(ctx), key); err != nil {
		s.log.Warn("delete unreferenced snapshot blob", "key", key, "err", err)
	}
}

// flatten merges snap's chain (parent's chain plus snap's own layer) into
// one layer with no parent, storing at most room bytes (< 0: unlimited).
func (s *Service) flatten(ctx context.Context, snap store.Snapshot, parent *store.Snapshot, room int64) (store.Snapshot, error) {
	chain, err := s.chain(ctx, parent)
	if err != nil {
		return snap, err
	}
	keys := append(chainKeys(chain), snap.BlobKey)
	readers := make([]io.Reader, 0, len(keys))
	for _, k := range keys {
		rc, err := s.opts.Blobs.Get(ctx, k)
		if err != nil {
			closeAll(readers)
			return snap, fmt.Errorf("open layer %s: %w", k, err)
		}
		readers = append(readers, rc)
	}
	defer closeAll(readers)
	pr, pw := io.Pipe()
	go func() {
		_, err := snapshot.Flatten(ctx, pw, readers, s.opts.BaseDir, s.opts.TempDir, snapshot.Manifest{BaseImage: snap.BaseImage}, s.opts.LayerBytes)
		pw.CloseWithError(err)
	}()
	info, err := s.opts.Blobs.Put(ctx, s.quotaReader(pr, room))
	pr.CloseWithError(err)
	if err != nil {
		return snap, fmt.Errorf("flatten %d layers: %w", len(keys), err)
	}
	s.log.Info("flattened snapshot chain", "layers", len(keys), "bytes", info.Size)
	snap.BlobKey, snap.Size, snap.ParentID, snap.Depth = info.Key, info.Size, "", 1
	return snap, nil
}

func closeAll(rs []io.Reader) {
	for _, r := range rs {
		if c, ok := r.(io.Closer); ok {
			c.Close()
		}
	}
}

// chain returns the snapshots from the bottom of the chain up to top.
func (s *Service) chain(ctx context.Context, top *store.Snapshot) ([]store.Snapshot, error) {
	var rev []store.Snapshot
	for cur := top; cur != nil; {
		rev = append(rev, *cur)
		if cur.ParentID == "" {
			break
		}
		if len(rev) > 4*s.opts.MaxDepth+16 {
			return nil, fmt.Errorf("snapshot chain of %s is too long", top.ID)
		}
		p, err := s.st.GetSnapshot(ctx, cur.ParentID)
		if err != nil {
			return nil, fmt.Errorf("load snapshot chain: %w", err)
		}
		cur = &p
	}
	out := make([]store.Snapshot, len(rev))
	for i, sn := range rev {
		out[len(rev)-1-i] = sn
	}
	return out, nil
}

func chainKeys(chain []store.Snapshot) []string {
	keys := make([]string, len(chain))
	for i, sn := range chain {
		keys[i] = sn.BlobKey
	}
	return keys
}

// Layers opens the chain of layers of the account's current snapshot,
// bottom first, or returns no layers when the account has none (or it
// expired). release closes what was opened.
func (s *Service) Layers(ctx context.Context, accountID string) ([]runtime.Layer, string, func(), error) {
	noop := func() {}
	env, err := s.st.GetEnvironment(ctx, accountID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && (env.SnapshotID == nil || !env.ExpiresAt.After(s.opts.Now()))) {
		return nil, "", noop, nil
	}
	if err != nil {
		return nil, "", noop, fmt.Errorf("load environment of %s: %w", accountID, err)
	}
	top, err := s.st.GetSnapshot(ctx, *env.SnapshotID)
	if err != nil {
		return nil, "", noop, fmt.Errorf("load snapshot %s: %w", *env.SnapshotID, err)
	}
	chain, err := s.chain(ctx, &top)
	if err != nil {
		return nil, "", noop, err
	}
	var opened []io.Reader
	release := func() { closeAll(opened) }
	layers := make([]runtime.Layer, 0, len(chain))
	for _, sn := range chain {
		rc, err := s.opts.Blobs.Get(ctx, sn.BlobKey)
		if err != nil {
			release()
			return nil, "", noop, fmt.Errorf("open layer of snapshot %s: %w", sn.ID, err)
		}
		opened = append(opened, rc)
		layers = append(layers, runtime.Layer{ID: "sha256:" + sn.BlobKey, R: rc})
	}
	return layers, top.ID, release, nil
}

func (s *Service) deleteBlobIfUnused(ctx context.Context, key string) error {
	n, err := s.st.CountSnapshotsWithBlob(ctx, key)
	if err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if err := s.opts.Blobs.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete blob %s: %w", key, err)
	}
	return nil
}

// collect deletes snapshots nothing refers to any more, passes after
// passes: deleting the top of a replaced chain unreferences the layer
// below it, and a chain left whole would count against its account's
// quota for as many captures as it is deep. It is best effort: what fails
// now is collected next time.
func (s *Service) collect(ctx context.Context) {
	for pass := 0; pass < 4*s.opts.MaxDepth+16; pass++ {
		if s.collectOnce(ctx) == 0 {
			return
		}
	}
}

// collectOnce deletes the snapshots unreferenced now, and says how many.
func (s *Service) collectOnce(ctx context.Context) int {
	snaps, err := s.st.ListUnreferencedSnapshots(ctx)
	if err != nil {
		s.log.Warn("list unreferenced snapshots", "err", err)
		return 0
	}
	deleted := 0
	for _, sn := range snaps {
		if s.opts.Now().Sub(sn.CreatedAt) < time.Minute {
			continue // may be about to be referenced by a run in flight
		}
		if err := s.st.DeleteSnapshot(ctx, sn.ID); err != nil {
			continue
		}
		deleted++
		if err := s.deleteBlobIfUnused(ctx, sn.BlobKey); err != nil {
			s.log.Warn("delete snapshot blob", "snapshot_id", sn.ID, "err", err)
		}
	}
	return deleted
}
