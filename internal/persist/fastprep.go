package persist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The workspace without git in the sandbox (issue 37). The script
// (prepareScript) starts eight processes in the sandbox and fetches over
// HTTP back to the server: 0.4–0.8 s under gVisor, all of it on the way
// to the sandbox's first command. Most sandboxes need none of it:
//
//   - a fresh sandbox (no /workspace/.git) gets the clone as one tar
//     archive the agent unpacks (runtime.Unpacker), built on the host
//     without a checkout (repo.WriteClone) and kept per account while its
//     branches and tags stay as they are (a sandbox's next sibling gets
//     the same bytes);
//   - a sandbox restored from a snapshot whose clone stands at main
//     already is left alone, after four small reads (main made to track
//     origin/main when it does not).
//
// Anything else — submodules or .gitattributes at main, a clone behind
// main or diverged, other files in /workspace, a runtime without
// Unpacker — runs the script as before.

// workspaceDir is where a sandbox's clone of its account's repository is.
const workspaceDir = "/workspace"

// errScript says the script must prepare this workspace.
var errScript = errors.New("the workspace needs the script")

// Bounds of the clone archives: one of more than maxFastClone (or of a
// repository larger than that) is the script's, in the background, as the
// create must not wait for it nor the host hold it in memory; the
// archives of up to maxCachedClone are kept, maxCachedClones in all.
const (
	maxFastClone    = 64 << 20
	maxCachedClone  = 4 << 20
	maxCachedClones = 64 << 20
)

// cloneCache keeps the last clone archive of each account, while its
// references are what it was made from.
type cloneCache struct {
	mu      sync.Mutex
	byAcct  map[string]*cachedClone
	total   int
	maxEach int
	maxAll  int
}

type cachedClone struct {
	key, url string
	data     []byte
	used     time.Time
}

func newCloneCache() *cloneCache {
	return &cloneCache{byAcct: map[string]*cachedClone{}, maxEach: maxCachedClone, maxAll: maxCachedClones}
}

func (c *cloneCache) get(account, key, url string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byAcct[account]
	if !ok || e.key != key || e.url != url {
		return nil, false
	}
	e.used = time.Now()
	return e.data, true
}

// put keeps data for account, dropping the least recently used archives
// of other accounts while the total is over the bound.
func (c *cloneCache) put(account, key, url string, data []byte) {
	if len(data) > c.maxEach {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.byAcct[account]; ok {
		c.total -= len(old.data)
	}
	c.byAcct[account] = &cachedClone{key: key, url: url, data: data, used: time.Now()}
	c.total += len(data)
	for c.total > c.maxAll {
		var oldest string
		for a, e := range c.byAcct {
			if a != account && (oldest == "" || e.used.Before(c.byAcct[oldest].used)) {
				oldest = a
			}
		}
		if oldest == "" {
			return
		}
		c.total -= len(c.byAcct[oldest].data)
		delete(c.byAcct, oldest)
	}
}

// fastPrepare readies sb's /workspace without running git in the sandbox
// when it can, and answers errScript when the script must.
func (s *Service) fastPrepare(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox) error {
	up, ok := rsb.(runtime.Unpacker)
	if !ok {
		return errScript
	}
	// Until the archive is sent, a failure leaves the workspace as it
	// was: the script tries then.
	fallBack := func(what string, err error) error {
		s.log.Warn("workspace: "+what+"; the script prepares it", "sandbox_id", sb.ID, "err", err)
		return errScript
	}
	start := time.Now()
	ents, err := rsb.ListDir(ctx, workspaceDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fallBack("list "+workspaceDir, err)
	}
	if len(ents) > 0 {
		err := s.atMain(ctx, sb, rsb, ents)
		s.log.Debug("workspace: a restored clone", "sandbox_id", sb.ID, "at_main", err == nil, "ms", time.Since(start).Milliseconds())
		return err
	}
	listed := time.Since(start)
	url := RepoURL(sb.AccountID)
	key, err := s.opts.Repos.RefsKey(ctx, sb.AccountID)
	if err != nil {
		return fallBack("read the repository's references", err)
	}
	data, ok := s.clones.get(sb.AccountID, key, url)
	if !ok {
		// The sandboxes of a burst build their account's archive once.
		v, err, _ := s.cloneBuilds.Do(sb.AccountID+" "+key, func() (any, error) {
			if size, err := s.opts.Repos.Usage(ctx, sb.AccountID); err != nil || size > maxFastClone {
				return nil, errScript
			}
			return s.writeClone(ctx, sb.AccountID, url)
		})
		if errors.Is(err, errScript) {
			return err
		}
		if err != nil {
			return fallBack("build the clone", err)
		}
		data = v.([]byte)
	}
	built := time.Since(start)
	files, err := up.Unpack(ctx, workspaceDir, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("unpack the clone into %s of %s: %w", workspaceDir, sb.ID, err)
	}
	s.log.Debug("workspace: unpacked", "sandbox_id", sb.ID, "files", files, "bytes", len(data), "kept", ok, "ms", time.Since(start).Milliseconds(), "list_ms", listed.Milliseconds(), "build_ms", built.Milliseconds())
	return nil
}

// writeClone builds the account's clone archive and keeps it.
func (s *Service) writeClone(ctx context.Context, accountID, url string) ([]byte, error) {
	f, err := os.CreateTemp(s.opts.TempDir, "clone-*.tar")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	key, err := s.opts.Repos.WriteClone(ctx, accountID, url, f)
	if errors.Is(err, repo.ErrNeedsCheckout) {
		return nil, errScript
	}
	if err != nil {
		return nil, fmt.Errorf("build the clone of %s: %w", accountID, err)
	}
	// Read back whole: within maxFastClone (the repository was, and
	// little is added); a large one is not kept (put), only sent.
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, err
	}
	if size > maxFastClone {
		return nil, errScript
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	s.clones.put(accountID, key, url, data)
	return data, nil
}

// atMain answers nil when the clone in /workspace (ents) stands at the
// repository's main already, as a sandbox restored from the snapshot its
// run pushed does: HEAD on main, main and origin/main at the
// repository's main, no submodules (main is made to track origin/main
// when it does not). Anything else is the script's.
func (s *Service) atMain(ctx context.Context, sb store.Sandbox, rsb runtime.Sandbox, ents []runtime.DirEntry) error {
	var hasGit bool
	for _, e := range ents {
		switch e.Name {
		case ".git":
			hasGit = e.Mode.IsDir()
		case ".gitmodules":
			return errScript
		}
	}
	if !hasGit {
		return errScript
	}
	head, err := s.opts.Repos.Head(ctx, sb.AccountID, repo.MainBranch)
	if err != nil || head == "" {
		return errScript
	}
	want := map[string]string{
		".git/HEAD":                     "ref: refs/heads/main",
		".git/refs/heads/main":          head,
		".git/refs/remotes/origin/main": head,
	}
	errc := make(chan error, len(want)+1)
	for p, v := range want {
		go func() {
			got, err := readSmall(ctx, rsb, workspaceDir+"/"+p, 256)
			if line, _, _ := strings.Cut(got, "\n"); err == nil && strings.TrimSpace(line) != v {
				err = errScript
			}
			errc <- err
		}()
	}
	var cfg string
	go func() {
		var err error
		cfg, err = readSmall(ctx, rsb, gitConfig, maxGitConfig+1)
		if err == nil && len(cfg) > maxGitConfig {
			err = errScript
		}
		errc <- err
	}()
	for range len(want) + 1 {
		if err := <-errc; err != nil {
			return errScript
		}
	}
	if strings.Contains(cfg, `[branch "main"]`) {
		return nil
	}
	// main does not track origin/main yet: the script sets it when it
	// first finds main, and a clone made while the repository was empty
	// (pushed to since, and snapshotted so) has it not. Set it as the
	// script's `git branch --set-upstream-to` would.
	cfg = strings.TrimRight(cfg, "\n") + "\n" + branchMainConfig
	if err := rsb.WriteFile(ctx, gitConfig, strings.NewReader(cfg), 0o644); err != nil {
		return fmt.Errorf("set main's upstream in %s: %w", gitConfig, err)
	}
	return nil
}

// The clone's configuration, the most of it atMain reads, and what makes
// main track origin/main in it.
const (
	gitConfig        = workspaceDir + "/.git/config"
	maxGitConfig     = 64 << 10
	branchMainConfig = "[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n"
)

// readSmall is the start of a small file in the sandbox, up to max bytes.
func readSmall(ctx context.Context, rsb runtime.Sandbox, p string, max int64) (string, error) {
	rc, err := rsb.ReadFile(ctx, p)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max))
	return string(b), err
}
