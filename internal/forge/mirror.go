package forge

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os/exec"
	"sort"
	"strings"
	"sync"
)

// MirrorOptions configure a Mirror.
type MirrorOptions struct {
	// Forge holds the mirrors. Required.
	Forge Forge
	// Token authenticates pushes to the forge (the token the forge was
	// configured with).
	Token string
	// Git is the git executable (default "git" from PATH).
	Git string
	// NamePrefix starts every mirror's name (default "sandbox-"); the
	// account id follows it.
	NamePrefix string
	// Public makes new mirrors public; by default they are private.
	Public bool
	Logger *slog.Logger
}

// Mirror keeps a forge repository per account up to date with the
// account's bare repository. It is safe for concurrent use; syncs of one
// account are serialised.
//
// A mirror is named NamePrefix + account id, not after the account's slug:
// ids are never reused, so a new account can never inherit the mirror (and
// the history) of a deleted account that had the same slug.
//
// Sync and SyncURL push branches only (refs/heads/*) and never delete a
// branch on the forge: branches pushed there directly, such as the coding
// agent's pull-request branches, stay. What was last pushed to a forge
// repository is recorded in the local repository under
// refs/forge/<owner>/<name>/heads/, which lets a sync overwrite its own
// earlier push (a branch rewritten here) but never commits that only the
// forge has: a pull request merged there, say.
type Mirror struct {
	opts MirrorOptions
	git  string
	log  *slog.Logger

	mu    sync.Mutex
	repos map[string]Repo        // account id → ensured forge repository
	locks map[string]*sync.Mutex // bare repository → serialises its syncs
}

// NewMirror returns a Mirror.
func NewMirror(opts MirrorOptions) (*Mirror, error) {
	if opts.Forge == nil {
		return nil, errors.New("forge: mirror needs a forge")
	}
	if opts.Git == "" {
		opts.Git = "git"
	}
	git, err := exec.LookPath(opts.Git)
	if err != nil {
		return nil, fmt.Errorf("forge: find git: %w", err)
	}
	if opts.NamePrefix == "" {
		opts.NamePrefix = "sandbox-"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Mirror{
		opts:  opts,
		git:   git,
		log:   opts.Logger,
		repos: make(map[string]Repo),
		locks: make(map[string]*sync.Mutex),
	}, nil
}

// RepoName is the name of accountID's mirror on the forge.
func (m *Mirror) RepoName(accountID string) string { return m.opts.NamePrefix + accountID }

// UnmirroredError lists branches a sync left alone on the forge, and why.
// The other branches were mirrored.
type UnmirroredError struct {
	FullName string
	// Branches maps a branch name to the reason it was not pushed.
	Branches map[string]string
}

// Reason a branch is left alone when the forge has commits that the
// local branch lacks.
const reasonDiverged = "the forge has commits sandboxd lacks"

func (e *UnmirroredError) Error() string {
	names := make([]string, 0, len(e.Branches))
	for b := range e.Branches {
		names = append(names, b)
	}
	sort.Strings(names)
	for i, b := range names {
		names[i] = b + " (" + e.Branches[b] + ")"
	}
	return fmt.Sprintf("branches not mirrored to %s: %s", e.FullName, strings.Join(names, ", "))
}

// Sync ensures accountID's mirror exists and pushes every branch of the
// bare repository at bareRepoPath to it that changed since the last sync.
// When nothing changed it costs one local git command and no network
// (after the first sync of the process, which looks the mirror up). It
// returns the mirror; the Repo is valid whenever the mirror was ensured,
// even when the error is an *UnmirroredError for some branches.
func (m *Mirror) Sync(ctx context.Context, accountID, bareRepoPath string) (Repo, error) {
	lock := m.lock(bareRepoPath)
	lock.Lock()
	defer lock.Unlock()

	r, err := m.ensure(ctx, accountID)
	if err != nil {
		return Repo{}, err
	}
	if err := m.syncTo(ctx, bareRepoPath, r); err != nil {
		var unmirrored *UnmirroredError
		if !errors.As(err, &unmirrored) {
			// The mirror may be gone (deleted on the forge): look it up
			// again next time rather than trusting the cache.
			m.forget(accountID)
		}
		return r, fmt.Errorf("mirror %s: %w", accountID, err)
	}
	return r, nil
}

// ErrNotOnForge: a URL does not name a repository on the mirror's forge, so
// the forge's token is not sent to it.
var ErrNotOnForge = errors.New("not a repository on the forge")

// SyncURL pushes the bare repository at bareRepoPath to the existing forge
// repository at repoURL (an account's own remote, set with PATCH
// github_repo) the way Sync pushes to a mirror: changed branches only,
// never losing the forge's commits. repoURL must be on the forge (its web
// or clone URL), else the error is ErrNotOnForge: the token goes nowhere
// else. The repository is not created.
func (m *Mirror) SyncURL(ctx context.Context, bareRepoPath, repoURL string) (Repo, error) {
	full, ok := m.opts.Forge.ParseRepoURL(repoURL)
	if !ok {
		return Repo{}, fmt.Errorf("push to %s: %w", redact(repoURL, m.opts.Token), ErrNotOnForge)
	}
	u, err := url.Parse(strings.TrimSpace(repoURL))
	if err != nil {
		return Repo{}, fmt.Errorf("push to %s: %w", redact(repoURL, m.opts.Token), ErrNotOnForge)
	}
	web := u.Scheme + "://" + u.Host + "/" + full
	r := Repo{CloneURL: web + ".git", HTMLURL: web, FullName: full}

	lock := m.lock(bareRepoPath)
	lock.Lock()
	defer lock.Unlock()
	if err := m.syncTo(ctx, bareRepoPath, r); err != nil {
		return r, fmt.Errorf("push to %s: %w", full, err)
	}
	return r, nil
}

// syncTo pushes what changed since the last sync to r.
func (m *Mirror) syncTo(ctx context.Context, dir string, r Repo) error {
	ns, err := trackingPrefix(r.FullName)
	if err != nil {
		return err
	}
	local, tracked, err := m.refs(ctx, dir, ns)
	if err != nil {
		return err
	}
	if upToDate(local, tracked) {
		return nil
	}
	return m.push(ctx, dir, r, ns, local, tracked)
}

// push moves the forge's branches to local's where that loses nothing, and
// records what the forge has afterwards.
func (m *Mirror) push(ctx context.Context, dir string, r Repo, ns string, local, tracked map[string]string) error {
	remote, err := lsRemoteHeads(ctx, m.git, dir, r.CloneURL, m.opts.Token)
	if err != nil {
		return err
	}
	var (
		leases, refspecs []string
		record           = make(map[string]string) // branch → commit on the forge now
		skipped          = make(map[string]string)
	)
	for _, b := range sortedKeys(local) {
		want, have := local[b], remote["refs/heads/"+b]
		switch {
		case have == want:
			record[b] = want
			continue
		case have == "":
			// New on the forge; the lease makes sure it still is.
		case have == tracked[b] || m.isAncestor(ctx, dir, have, want):
			// Our own earlier push, or a fast-forward: nothing is lost.
		default:
			skipped[b] = reasonDiverged
			continue
		}
		ref := "refs/heads/" + b
		leases = append(leases, "--force-with-lease="+ref+":"+have)
		refspecs = append(refspecs, ref+":"+ref)
	}
	var pushErr error
	pushed := 0
	if len(refspecs) > 0 {
		var updates []refUpdate
		updates, pushErr = push(ctx, m.git, dir, r.CloneURL, m.opts.Token, leases, refspecs)
		rejected := false
		for _, u := range updates {
			b, ok := strings.CutPrefix(u.to, "refs/heads/")
			if !ok {
				continue
			}
			switch {
			case !u.ok():
				rejected = true
				// "[rejected] (stale info)", "[remote rejected] (reason)"
				skipped[b] = strings.NewReplacer("[", "", "]", "").Replace(u.summary)
			case u.flag == '=':
				record[b] = local[b]
			default:
				record[b] = local[b]
				pushed++
			}
		}
		if rejected {
			// Git failed because of the refs now listed as skipped;
			// the others landed.
			pushErr = nil
		}
	}
	if err := m.record(ctx, dir, ns, record, tracked, local); err != nil {
		return err
	}
	if pushErr != nil {
		return pushErr
	}
	if pushed > 0 {
		m.log.InfoContext(ctx, "mirrored branches", "repo", r.FullName, "pushed", pushed)
	}
	if len(skipped) > 0 {
		return &UnmirroredError{FullName: r.FullName, Branches: skipped}
	}
	return nil
}

// record updates the tracking refs: the commit each branch has on the
// forge now, and no ref for branches deleted here.
func (m *Mirror) record(ctx context.Context, dir, ns string, record, tracked, local map[string]string) error {
	var stdin bytes.Buffer
	for b, sha := range record {
		if tracked[b] != sha {
			fmt.Fprintf(&stdin, "update %s%s %s\n", ns, b, sha)
		}
	}
	for b := range tracked {
		if _, ok := local[b]; !ok {
			fmt.Fprintf(&stdin, "delete %s%s\n", ns, b)
		}
	}
	if stdin.Len() == 0 {
		return nil
	}
	cmd := exec.CommandContext(ctx, m.git, "--git-dir="+dir, "update-ref", "--stdin")
	cmd.Env = baseGitEnv()
	cmd.Stdin = &stdin
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("record mirrored refs in %s: %w: %s", dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// refs returns the local branches and the tracking refs under ns, by
// branch name.
func (m *Mirror) refs(ctx context.Context, dir, ns string) (local, tracked map[string]string, err error) {
	cmd := exec.CommandContext(ctx, m.git, "--git-dir="+dir, "for-each-ref", "--format=%(objectname) %(refname)", "refs/heads/", ns)
	cmd.Env = baseGitEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("list branches of %s: %w: %s", dir, err, strings.TrimSpace(stderr.String()))
	}
	local, tracked = make(map[string]string), make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		sha, ref, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if b, ok := strings.CutPrefix(ref, "refs/heads/"); ok {
			local[b] = sha
		} else if b, ok := strings.CutPrefix(ref, ns); ok {
			tracked[b] = sha
		}
	}
	return local, tracked, nil
}

// isAncestor tells whether commit a is contained in b; false when a is not
// in the local repository at all.
func (m *Mirror) isAncestor(ctx context.Context, dir, a, b string) bool {
	cmd := exec.CommandContext(ctx, m.git, "--git-dir="+dir, "merge-base", "--is-ancestor", a, b)
	cmd.Env = baseGitEnv()
	return cmd.Run() == nil
}

func (m *Mirror) ensure(ctx context.Context, accountID string) (Repo, error) {
	m.mu.Lock()
	r, ok := m.repos[accountID]
	m.mu.Unlock()
	if ok {
		return r, nil
	}
	r, err := m.opts.Forge.EnsureRepo(ctx, m.RepoName(accountID), "sandboxd workspace of account "+accountID, !m.opts.Public)
	if err != nil {
		return Repo{}, fmt.Errorf("mirror %s: %w", accountID, err)
	}
	if r.CloneURL == "" || r.FullName == "" {
		return Repo{}, fmt.Errorf("mirror %s: the forge returned no clone URL or name", accountID)
	}
	m.mu.Lock()
	m.repos[accountID] = r
	m.mu.Unlock()
	return r, nil
}

func (m *Mirror) forget(accountID string) {
	m.mu.Lock()
	delete(m.repos, accountID)
	m.mu.Unlock()
}

// lock returns the mutex of a bare repository. There is one per
// repository ever synced: a few bytes per account.
func (m *Mirror) lock(dir string) *sync.Mutex {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.locks[dir]
	if !ok {
		l = new(sync.Mutex)
		m.locks[dir] = l
	}
	return l
}

// upToDate tells whether every local branch is on the forge as recorded.
func upToDate(local, tracked map[string]string) bool {
	if len(local) != len(tracked) {
		return false
	}
	for b, sha := range local {
		if tracked[b] != sha {
			return false
		}
	}
	return true
}

// trackingPrefix is where the commits last seen on the mirror fullName are
// recorded: refs/forge/<owner>/<name>/heads/.
func trackingPrefix(fullName string) (string, error) {
	owner, name, ok := strings.Cut(fullName, "/")
	if !ok || !validOwner(owner) || !validRepoName(name) || !refComponent(name) {
		return "", fmt.Errorf("forge repository name %q cannot name a ref", fullName)
	}
	return "refs/forge/" + owner + "/" + name + "/heads/", nil
}

// refComponent: git refuses ref components starting with '.', ending in
// ".lock" or holding "..".
func refComponent(s string) bool {
	return !strings.HasPrefix(s, ".") && !strings.HasSuffix(s, ".lock") && !strings.Contains(s, "..")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
