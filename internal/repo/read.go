package repo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
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
	repoPath, err := m.existing(id)
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
	mods, err := modulesOf(tree)
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
		subOwner, subPath, err := m.submoduleRepo(ctx, account, owner, sub)
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
	blob, err := object.GetBlob(st, e.Hash)
	if err != nil {
		return nil, fmt.Errorf("read blob %s (%s): %w", e.Hash, p, err)
	}
	r, err := blob.Reader()
	if err != nil {
		return nil, fmt.Errorf("read blob %s (%s): %w", e.Hash, p, err)
	}
	defer r.Close()
	data := bytes.NewBuffer(make([]byte, 0, blob.Size))
	if _, err := io.Copy(data, r); err != nil {
		return nil, fmt.Errorf("read blob %s (%s): %w", e.Hash, p, err)
	}
	return data.Bytes(), nil
}
