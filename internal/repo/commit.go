package repo

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/format/objfile"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// File is one file to commit.
type File struct {
	// Path inside the repository, "/"-separated.
	Path string
	// Mode is filemode.Regular (the zero value means it too),
	// filemode.Executable or filemode.Symlink.
	Mode filemode.FileMode
	// Content yields exactly Size bytes; it is streamed into the object
	// store, never held whole in memory.
	Content io.Reader
	Size    int64
}

// BytesFile is a File with content data.
func BytesFile(path string, data []byte) File {
	return File{Path: path, Content: strings.NewReader(string(data)), Size: int64(len(data))}
}

// Signature names the author of a commit.
type Signature struct {
	Name  string
	Email string
}

// DefaultAuthor signs commits whose author is not given.
var DefaultAuthor = Signature{Name: "sandboxd", Email: "sandboxd@localhost"}

// maxCommitAttempts bounds how often a commit is rebuilt on a branch that
// moved under it before ErrConflict is returned.
const maxCommitAttempts = 8

// CommitFiles writes files to branch of account's repository in one commit
// and returns the commit and the blob id of each file by path. The
// repository is created if needed, and the branch if it does not exist.
// No worktree is involved: blobs are streamed into the object store, trees
// are rebuilt along the changed paths only, and the branch moves by
// compare-and-swap; when it moved meanwhile (a push), the commit is rebuilt
// on the new head, so neither is lost.
//
// A file whose path lies inside a submodule is committed to the
// submodule's repository, on the branch .gitmodules names (main by
// default), and the parent's gitlink moves to that new commit in the
// parent's commit: one commit in each repository. The commit returned is
// the one of account's repository.
func (m *Manager) CommitFiles(ctx context.Context, accountID, branch string, files []File, message string, author Signature) (string, map[string]string, error) {
	id, err := CanonicalID(accountID)
	if err != nil {
		return "", nil, err
	}
	if err := plumbing.NewBranchReferenceName(branch).Validate(); err != nil || branch == "" {
		return "", nil, fmt.Errorf("branch %q: %w", branch, ErrInvalidPath)
	}
	if len(files) == 0 {
		return "", nil, fmt.Errorf("commit to %s: no files: %w", id, ErrInvalidPath)
	}
	seen := map[string]bool{}
	clean := make([]File, len(files))
	for i, f := range files {
		p, err := validWritePath(f.Path)
		if err != nil {
			return "", nil, err
		}
		if seen[p] {
			return "", nil, fmt.Errorf("%s given twice: %w", p, ErrInvalidPath)
		}
		seen[p] = true
		switch f.Mode {
		case 0:
			f.Mode = filemode.Regular
		case filemode.Regular, filemode.Executable, filemode.Symlink:
		default:
			return "", nil, fmt.Errorf("%s: mode %o cannot be committed: %w", p, f.Mode, ErrInvalidPath)
		}
		if f.Content == nil || f.Size < 0 {
			return "", nil, fmt.Errorf("%s: no content: %w", p, ErrInvalidPath)
		}
		f.Path = p
		clean[i] = f
	}
	if author.Name == "" || author.Email == "" {
		author = DefaultAuthor
	}
	if _, err := m.Ensure(ctx, id); err != nil {
		return "", nil, err
	}
	c := &committer{m: m, account: id, message: message, author: author, blobs: map[string]string{}}
	var commit plumbing.Hash
	err = m.change(ctx, id, func(ctx context.Context, repoPath string) error {
		var err error
		commit, err = c.commit(ctx, id, repoPath, branch, "", clean, 0)
		return err
	})
	if err != nil {
		return "", nil, fmt.Errorf("commit to %s of %s: %w", branch, id, err)
	}
	return commit.String(), c.blobs, nil
}

// validWritePath cleans p and refuses paths git would refuse to check out:
// empty, escaping, or with a .git component.
func validWritePath(p string) (string, error) {
	c := cleanPath(p)
	if c == "" {
		return "", fmt.Errorf("path %q: %w", p, ErrInvalidPath)
	}
	for _, seg := range strings.Split(c, "/") {
		if strings.EqualFold(seg, ".git") || seg == "." {
			return "", fmt.Errorf("path %q: %w", p, ErrInvalidPath)
		}
	}
	return c, nil
}

// committer carries what one CommitFiles call shares across the
// repositories it commits to.
type committer struct {
	m       *Manager
	account string // on whose behalf submodules are followed
	message string
	author  Signature
	blobs   map[string]string // full path → blob id
}

// change is one entry to set in a tree.
type change struct {
	path string
	mode filemode.FileMode
	hash plumbing.Hash
}

// commit commits files (paths relative to this repository; prefix is where
// the repository sits in the outermost one) to branch of owner's
// repository at repoPath.
func (c *committer) commit(ctx context.Context, owner, repoPath, branch, prefix string, files []File, depth int) (plumbing.Hash, error) {
	st := openStorage(repoPath)
	defer st.Close()
	head0, tree0, err := headTree(st, branch)
	if err != nil {
		return plumbing.ZeroHash, err
	}
	mods, err := modulesIn(st, tree0)
	if err != nil {
		return plumbing.ZeroHash, err
	}

	// Route each file: into the submodule containing it, or here.
	var own []File
	groups := map[string][]File{}
	subs := map[string]submodule{}
	for _, f := range files {
		sub, ok := submoduleFor(tree0, mods, f.Path)
		if !ok {
			own = append(own, f)
			continue
		}
		if f.Path == sub.Path {
			return plumbing.ZeroHash, fmt.Errorf("%s%s is a submodule: %w", prefix, f.Path, ErrInvalidPath)
		}
		f.Path = f.Path[len(sub.Path)+1:]
		groups[sub.Path] = append(groups[sub.Path], f)
		subs[sub.Path] = sub
	}

	// The quota is checked before anything is written, here or in a
	// submodule: a refused commit leaves no object behind. Blobs count at
	// their uncompressed size, trees and the commit not at all.
	var adding int64
	for _, f := range own {
		adding += f.Size
	}
	if err := c.m.checkQuota(owner, repoPath, adding); err != nil {
		return plumbing.ZeroHash, err
	}

	var changes []change
	// Submodules first, so that their new commits exist before the gitlinks
	// naming them.
	subPaths := make([]string, 0, len(groups))
	for p := range groups {
		subPaths = append(subPaths, p)
	}
	sort.Strings(subPaths)
	for _, sp := range subPaths {
		if depth >= maxSubmoduleDepth {
			return plumbing.ZeroHash, fmt.Errorf("submodules nested deeper than %d at %s%s: %w", maxSubmoduleDepth, prefix, sp, ErrInvalidPath)
		}
		sub := subs[sp]
		subOwner, subRepo, err := c.m.submoduleRepo(ctx, c.account, owner, sub, UseWrite)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		subBranch := sub.Branch
		if subBranch == "" {
			subBranch = MainBranch
		} else if subBranch == "." {
			subBranch = branch
		}
		// The submodule's repository is another account's: its change is
		// published on its own (in a cluster, under its own lock).
		var h plumbing.Hash
		err = c.m.change(ctx, subOwner, func(ctx context.Context, _ string) error {
			var err error
			h, err = c.commit(ctx, subOwner, subRepo, subBranch, prefix+sp+"/", groups[sp], depth+1)
			return err
		})
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("in submodule %s%s: %w", prefix, sp, err)
		}
		changes = append(changes, change{path: sp, mode: filemode.Submodule, hash: h})
	}
	for _, f := range own {
		h, err := writeBlob(repoPath, f.Content, f.Size)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("store %s%s: %w", prefix, f.Path, err)
		}
		changes = append(changes, change{path: f.Path, mode: f.Mode, hash: h})
		c.blobs[prefix+f.Path] = h.String()
	}

	l := c.m.lock(repoPath)
	l.Lock()
	defer l.Unlock()
	head, tree := head0, tree0
	for attempt := 1; ; attempt++ {
		if head != head0 {
			// The branch moved since the files were routed: the routing
			// must still hold on the new head.
			mods, err := modulesIn(st, tree)
			if err != nil {
				return plumbing.ZeroHash, err
			}
			for _, f := range own {
				if sub, ok := submoduleFor(tree, mods, f.Path); ok {
					return plumbing.ZeroHash, fmt.Errorf("%s%s now lies in submodule %s: %w", prefix, f.Path, sub.Path, ErrConflict)
				}
			}
			for _, sp := range subPaths {
				if sub, ok := submoduleFor(tree, mods, sp+"/x"); !ok || sub.Path != sp || sub.URL != subs[sp].URL {
					return plumbing.ZeroHash, fmt.Errorf("submodule %s%s changed: %w", prefix, sp, ErrConflict)
				}
			}
		}
		base := plumbing.ZeroHash
		var parents []plumbing.Hash
		if tree != nil {
			base = tree.Hash
			parents = []plumbing.Hash{head}
		}
		root, err := buildTree(st, base, prefix, changes)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		commit, err := writeCommit(st, root, parents, c.message, c.author)
		if err != nil {
			return plumbing.ZeroHash, err
		}
		if c.m.beforeUpdateRef != nil {
			c.m.beforeUpdateRef(repoPath)
		}
		err = c.m.updateRef(ctx, repoPath, branch, commit, head, c.message)
		if err == nil {
			c.m.log.InfoContext(ctx, "committed", "repository", owner, "branch", branch, "commit", commit.String(), "files", len(changes), "attempt", attempt)
			c.m.maybeGC(ctx, repoPath)
			return commit, nil
		}
		moved, tree2, herr := headTree(st, branch)
		if herr != nil {
			return plumbing.ZeroHash, herr
		}
		if moved == head {
			return plumbing.ZeroHash, err // not a race: a real failure
		}
		if attempt >= maxCommitAttempts {
			return plumbing.ZeroHash, fmt.Errorf("%s moved %d times: %w", branch, attempt, ErrConflict)
		}
		head, tree = moved, tree2
	}
}

// headTree returns branch's commit and root tree; both zero/nil when the
// branch does not exist.
func headTree(st *filesystem.Storage, branch string) (plumbing.Hash, *object.Tree, error) {
	head, err := branchHead(st, branch)
	if err != nil || head.IsZero() {
		return head, nil, err
	}
	c, err := object.GetCommit(st, head)
	if err != nil {
		return plumbing.ZeroHash, nil, fmt.Errorf("read commit %s of %s: %w", head, branch, err)
	}
	t, err := c.Tree()
	if err != nil {
		return plumbing.ZeroHash, nil, fmt.Errorf("read tree of %s: %w", head, err)
	}
	return head, t, nil
}

func modulesIn(st *filesystem.Storage, tree *object.Tree) ([]submodule, error) {
	if tree == nil {
		return nil, nil
	}
	return modulesOf(st, tree)
}

// submoduleFor returns the submodule (longest .gitmodules path with a
// gitlink in tree) that contains p or is p.
func submoduleFor(tree *object.Tree, mods []submodule, p string) (submodule, bool) {
	for _, s := range mods {
		if p != s.Path && !strings.HasPrefix(p, s.Path+"/") {
			continue
		}
		if _, ok := gitlink(tree, s.Path); ok {
			return s, true
		}
	}
	return submodule{}, false
}

// buildTree applies changes (paths relative to the tree) to the tree base
// (zero for an empty one), writing the new trees along the changed paths,
// and returns the new tree's id. prefix is for messages.
func buildTree(st *filesystem.Storage, base plumbing.Hash, prefix string, changes []change) (plumbing.Hash, error) {
	var entries []object.TreeEntry
	if !base.IsZero() {
		t, err := object.GetTree(st, base)
		if err != nil {
			return plumbing.ZeroHash, fmt.Errorf("read tree %s: %w", base, err)
		}
		entries = append(entries, t.Entries...)
	}
	index := map[string]int{}
	for i, e := range entries {
		index[e.Name] = i
	}
	set := func(e object.TreeEntry) {
		if i, ok := index[e.Name]; ok {
			entries[i] = e
			return
		}
		index[e.Name] = len(entries)
		entries = append(entries, e)
	}

	nested := map[string][]change{}
	var names []string
	for _, ch := range changes {
		name, rest, deeper := strings.Cut(ch.path, "/")
		if !deeper {
			if i, ok := index[name]; ok && entries[i].Mode == filemode.Dir {
				return plumbing.ZeroHash, fmt.Errorf("%s%s is a directory: %w", prefix, name, ErrInvalidPath)
			}
			set(object.TreeEntry{Name: name, Mode: ch.mode, Hash: ch.hash})
			continue
		}
		if _, ok := nested[name]; !ok {
			names = append(names, name)
		}
		nested[name] = append(nested[name], change{path: rest, mode: ch.mode, hash: ch.hash})
	}
	for _, name := range names {
		sub := plumbing.ZeroHash
		if i, ok := index[name]; ok {
			if entries[i].Mode != filemode.Dir {
				return plumbing.ZeroHash, fmt.Errorf("%s%s is not a directory: %w", prefix, name, ErrInvalidPath)
			}
			sub = entries[i].Hash
		}
		h, err := buildTree(st, sub, prefix+name+"/", nested[name])
		if err != nil {
			return plumbing.ZeroHash, err
		}
		set(object.TreeEntry{Name: name, Mode: filemode.Dir, Hash: h})
	}

	sort.Sort(object.TreeEntrySorter(entries))
	t := &object.Tree{Entries: entries}
	obj := st.NewEncodedObject()
	if err := t.Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("encode tree %s: %w", prefix, err)
	}
	h, err := st.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("store tree %s: %w", prefix, err)
	}
	return h, nil
}

func writeCommit(st *filesystem.Storage, tree plumbing.Hash, parents []plumbing.Hash, message string, author Signature) (plumbing.Hash, error) {
	if !strings.HasSuffix(message, "\n") {
		message += "\n"
	}
	sig := object.Signature{Name: author.Name, Email: author.Email, When: time.Now()}
	c := &object.Commit{Author: sig, Committer: sig, Message: message, TreeHash: tree, ParentHashes: parents}
	obj := st.NewEncodedObject()
	if err := c.Encode(obj); err != nil {
		return plumbing.ZeroHash, fmt.Errorf("encode commit: %w", err)
	}
	h, err := st.SetEncodedObject(obj)
	if err != nil {
		return plumbing.ZeroHash, fmt.Errorf("store commit: %w", err)
	}
	return h, nil
}

// writeBlob streams size bytes of r into a loose blob object of the
// repository at repoPath. The object is written aside and renamed into
// place only when complete, so a short or failed read leaves nothing.
func writeBlob(repoPath string, r io.Reader, size int64) (h plumbing.Hash, err error) {
	dir := filepath.Join(repoPath, "objects")
	tmp, err := os.CreateTemp(dir, "tmp_obj_")
	if err != nil {
		return plumbing.ZeroHash, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := objfile.NewWriter(tmp)
	if err := w.WriteHeader(plumbing.BlobObject, size); err != nil {
		return plumbing.ZeroHash, err
	}
	n, err := io.Copy(w, io.LimitReader(r, size))
	if err != nil {
		return plumbing.ZeroHash, err
	}
	if n != size {
		return plumbing.ZeroHash, fmt.Errorf("content has %d bytes, want %d: %w", n, size, io.ErrUnexpectedEOF)
	}
	var extra [1]byte
	if k, _ := io.ReadFull(r, extra[:]); k > 0 {
		return plumbing.ZeroHash, fmt.Errorf("content has more than %d bytes", size)
	}
	if err := w.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := tmp.Close(); err != nil {
		return plumbing.ZeroHash, err
	}
	h = w.Hash()
	hex := h.String()
	final := filepath.Join(dir, hex[:2], hex[2:])
	if _, err := os.Stat(final); err == nil {
		// Content-addressed: an existing object is this very object.
		return h, os.Remove(tmp.Name())
	}
	if err := os.MkdirAll(filepath.Dir(final), 0o755); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := os.Chmod(tmp.Name(), 0o444); err != nil {
		return plumbing.ZeroHash, err
	}
	if err := os.Rename(tmp.Name(), final); err != nil {
		return plumbing.ZeroHash, err
	}
	return h, nil
}

// maybeGC packs the repository when git thinks it has too many loose
// objects (gc.auto, set low by Ensure): objects written here are loose, and
// listing a tree with sizes reads every blob's header, which is several
// times slower for loose objects than for packed ones. Below the threshold
// this costs one short git process. A failure is only logged: the commit
// stands.
func (m *Manager) maybeGC(ctx context.Context, repoPath string) {
	if _, err := m.run(ctx, repoPath, nil, "-c", "gc.autoDetach=false", "gc", "--auto", "--quiet"); err != nil {
		m.log.WarnContext(ctx, "git gc --auto failed", "repository", repoPath, "err", err)
	}
}

// updateRef moves branch from old (zero: the branch must not exist) to
// commit with git update-ref, which takes the ref lock git receive-pack
// takes and fails when the branch is no longer at old.
func (m *Manager) updateRef(ctx context.Context, repoPath, branch string, commit, old plumbing.Hash, message string) error {
	subject, _, _ := strings.Cut(strings.TrimSpace(message), "\n")
	_, err := m.run(ctx, repoPath, nil, "update-ref", "-m", "sandboxd: "+subject,
		"refs/heads/"+branch, commit.String(), old.String())
	if err != nil {
		return fmt.Errorf("move %s to %s: %w", branch, commit, err)
	}
	return nil
}
