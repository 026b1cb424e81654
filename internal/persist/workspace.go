package persist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// preparation is the state of a sandbox's workspace; mu serialises the git
// work in it.
type preparation struct {
	mu   sync.Mutex
	done bool
	err  error
	// scriptOnly says the fast ways were just tried and declined
	// (prepareFast): the preparation that follows runs the script
	// without trying them again.
	scriptOnly bool
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
	fast := !p.scriptOnly
	p.scriptOnly = false
	s.finish(p, sb, s.prepare(ctx, sb, rsb, fast))
	return p.err
}

// finish records the outcome of sb's preparation in p, logging a failure.
// Callers hold p.mu.
func (s *Service) finish(p *preparation, sb store.Sandbox, err error) {
	p.err, p.done = err, true
	if err != nil {
		s.log.Warn("prepare workspace", "sandbox_id", sb.ID, "err", err)
	}
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

// prepareFast readies the workspace under p's lock the fast ways
// (fastPrepare), unless it is done: it answers false when the script must
// still run, which prepareOnce then does.
func (s *Service) prepareFast(ctx context.Context, p *preparation, sb store.Sandbox, rsb runtime.Sandbox) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return true
	}
	if _, err := s.opts.Repos.Ensure(ctx, sb.AccountID); err != nil {
		return false // the script's run says it
	}
	err := s.fastPrepare(ctx, sb, rsb)
	if errors.Is(err, errScript) {
		p.scriptOnly = true
		return false
	}
	s.finish(p, sb, err)
	return true
}

// prepare readies sb's workspace: the fast ways first (unless fast is
// false: they were just tried), else the script.
func (s *Service) prepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, fast bool) error {
	if _, err := s.opts.Repos.Ensure(ctx, sb.AccountID); err != nil {
		return fmt.Errorf("ensure repository of %s: %w", sb.AccountID, err)
	}
	if fast {
		if err := s.fastPrepare(ctx, sb, rsb); !errors.Is(err, errScript) {
			return err
		}
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
	if sb.TemplateID != "" {
		return saved, nil // its layer is not the account's snapshot (Capture)
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
