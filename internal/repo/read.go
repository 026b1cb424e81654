package repo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path"
	"strconv"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/sandboxd/sandboxd/internal/capbuf"
)

// cleanPath normalises a path inside a repository; "" means the path is
// empty, absolute tricks aside, or tries to leave the repository.
func cleanPath(p string) string {
	p = strings.Trim(p, "/")
	if p == "" {
		return ""
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." || strings.ContainsRune(seg, 0) {
			return ""
		}
	}
	p = path.Clean(p)
	if p == "." {
		return ""
	}
	return p
}

// ReadFile returns the content of the file at p on main of account's
// repository. When p lies inside a submodule (the longest matching path of
// .gitmodules whose gitlink is in the tree), the rest of p is read from the
// submodule's repository at the commit the gitlink records, and so on
// through nested submodules. Directories, gitlinks and missing paths are
// ErrNotFound; so is any path of a repository without commits.
func (m *Manager) ReadFile(ctx context.Context, accountID, p string) ([]byte, error) {
	id, err := CanonicalID(accountID)
	if err != nil {
		return nil, err
	}
	repoPath, err := m.existing(ctx, id)
	if err != nil {
		return nil, err
	}
	clean := cleanPath(p)
	if clean == "" {
		return nil, fmt.Errorf("read %q: %w", p, ErrNotFound)
	}
	data, err := m.readAt(ctx, id, id, repoPath, plumbing.ZeroHash, clean, 0)
	if err != nil {
		return nil, fmt.Errorf("read %s of %s: %w", clean, id, err)
	}
	return data, nil
}

// readAt reads p at commit (main when zero) of owner's repository at
// repoPath, on behalf of account.
func (m *Manager) readAt(ctx context.Context, account, owner, repoPath string, commit plumbing.Hash, p string, depth int) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	st := openStorage(repoPath)
	defer st.Close()
	if commit.IsZero() {
		h, err := branchHead(st, MainBranch)
		if err != nil {
			return nil, err
		}
		if h.IsZero() {
			return nil, fmt.Errorf("repository of %s has no commits: %w", owner, ErrNotFound)
		}
		commit = h
	}
	c, err := object.GetCommit(st, commit)
	if errors.Is(err, plumbing.ErrObjectNotFound) {
		return nil, fmt.Errorf("commit %s is not in the repository of %s: %w", commit, owner, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read commit %s of %s: %w", commit, owner, err)
	}
	tree, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("read tree of %s in %s: %w", commit, owner, err)
	}
	mods, err := modulesOf(st, tree)
	if err != nil {
		return nil, fmt.Errorf("%s at %s: %w", owner, commit, err)
	}
	for _, sub := range mods {
		if p != sub.Path && !strings.HasPrefix(p, sub.Path+"/") {
			continue
		}
		link, ok := gitlink(tree, sub.Path)
		if !ok {
			continue // listed but not in the tree: try a shorter one
		}
		if p == sub.Path {
			return nil, fmt.Errorf("%s is a submodule, not a file: %w", p, ErrNotFound)
		}
		if depth >= maxSubmoduleDepth {
			return nil, fmt.Errorf("submodules nested deeper than %d at %s: %w", maxSubmoduleDepth, sub.Path, ErrNotFound)
		}
		subOwner, subPath, err := m.submoduleRepo(ctx, account, owner, sub, UseRead)
		if err != nil {
			return nil, err
		}
		data, err := m.readAt(ctx, account, subOwner, subPath, plumbing.NewHash(link), p[len(sub.Path)+1:], depth+1)
		if err != nil {
			return nil, fmt.Errorf("in submodule %s: %w", sub.Path, err)
		}
		return data, nil
	}
	e, err := tree.FindEntry(p)
	if err != nil {
		return nil, fmt.Errorf("%s at %s: %w", p, commit, ErrNotFound)
	}
	if e.Mode == filemode.Dir || e.Mode == filemode.Submodule {
		return nil, fmt.Errorf("%s is not a file: %w", p, ErrNotFound)
	}
	data, err := m.readBlob(ctx, repoPath, e.Hash, p)
	if err != nil {
		return nil, fmt.Errorf("read blob %s (%s): %w", e.Hash, p, err)
	}
	return data, nil
}

// readBlob returns blob h of the repository at repoPath (the file p),
// refusing one larger than the read limit (TooLargeError) before reading
// any of its content. git cat-file --batch prints the object's size first,
// taken from its header (for a delta, from the delta's header), so a blob
// that inflates to gigabytes from a few bytes of push costs nothing to
// refuse; below the limit the content is streamed into a buffer of exactly
// that size. (go-git would inflate a delta whole to learn its size.)
func (m *Manager) readBlob(ctx context.Context, repoPath string, h plumbing.Hash, p string) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.git, "--git-dir="+repoPath, "cat-file", "--batch")
	cmd.Env = gitEnv()
	cmd.Stdin = strings.NewReader(h.String() + "\n")
	stderr := capbuf.New(4 << 10)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start git cat-file: %w", err)
	}
	// Once the answer is read (or refused), git is stopped rather than
	// waited for: it may be blocked writing content nobody will read.
	defer func() { cancel(); _ = cmd.Wait() }()
	br := bufio.NewReaderSize(stdout, 64<<10)
	header, err := br.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("git cat-file: %w: %s", err, strings.TrimSpace(stderr.String("dropped")))
	}
	// "<object> <type> <size>" or "<object> missing".
	f := strings.Fields(header)
	if len(f) == 2 && f[1] == "missing" {
		return nil, fmt.Errorf("object %s is missing: %w", h, ErrNotFound)
	}
	if len(f) != 3 {
		return nil, fmt.Errorf("git cat-file: unexpected header %q", header)
	}
	if f[1] != "blob" {
		return nil, fmt.Errorf("%s is a %s, not a file: %w", p, f[1], ErrNotFound)
	}
	size, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || size < 0 {
		return nil, fmt.Errorf("git cat-file: unexpected header %q", header)
	}
	if limit := m.limits.MaxReadBytes; limit > 0 && size > limit {
		return nil, &TooLargeError{Path: p, Size: size, Limit: limit}
	}
	data := make([]byte, size)
	if _, err := io.ReadFull(br, data); err != nil {
		return nil, fmt.Errorf("git cat-file: read %d bytes: %w", size, err)
	}
	return data, nil
}
