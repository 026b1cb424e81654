package repo

import (
	"bufio"
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	"github.com/sandboxd/sandboxd/internal/capbuf"
)

// Entry is one entry of a recursive tree listing.
type Entry struct {
	Path string
	// Type is "blob" (a file or symlink), "tree" (a directory) or "commit"
	// (a submodule's gitlink, naming a commit of another repository).
	Type string
	// Mode is the git file mode (0100644, 0100755, 0120000, 040000, 0160000).
	Mode uint32
	// SHA is the object id.
	SHA string
	// Size is the size of a blob in bytes; -1 for trees and gitlinks.
	Size int64
}

// Tree lists main of account's repository recursively, directories before
// their contents, in git's order. A repository without commits has an empty
// tree. Gitlinks are listed as entries of type "commit"; the submodule's
// own files are not.
//
// The listing stops at the limits (TreeMaxEntries entries, TreeMaxPathBytes
// bytes of paths) and truncated says so: a few trees that name one subtree
// many times list as billions of paths from a push of a few hundred bytes,
// so the listing is read as it is made and never held past the limits.
//
// The listing is `git ls-tree -r -t -l` (the fastest way to get sizes: one
// process, object headers read in C) cached per commit, so repeated
// listings of an unchanged branch cost one reference lookup.
func (m *Manager) Tree(ctx context.Context, accountID string) (entries []Entry, truncated bool, err error) {
	p, err := m.existing(ctx, accountID)
	if err != nil {
		return nil, false, err
	}
	st := openStorage(p)
	head, err := branchHead(st, MainBranch)
	st.Close()
	if err != nil {
		return nil, false, fmt.Errorf("tree of %s: %w", accountID, err)
	}
	if head.IsZero() {
		return []Entry{}, false, nil
	}
	key := p + "\x00" + head.String()
	if cached, ok := m.treeCache.get(key); ok {
		return append([]Entry(nil), cached.entries...), cached.truncated, nil
	}
	entries, truncated, err = m.listTree(ctx, p, head.String())
	if err != nil {
		return nil, false, fmt.Errorf("tree of %s at %s: %w", accountID, head, err)
	}
	m.treeCache.put(key, listing{entries: entries, truncated: truncated})
	return append([]Entry(nil), entries...), truncated, nil
}

// maxTreeRecord bounds one record of ls-tree's output (git allows names of
// any length; the path bytes limit applies too).
const maxTreeRecord = 64 << 10

// listTree streams `git ls-tree -r -t -l -z commit` in the repository at p
// and parses it up to the limits; past them git is stopped.
func (m *Manager) listTree(ctx context.Context, p, commit string) ([]Entry, bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.git, "--git-dir="+p, "ls-tree", "-r", "-t", "-l", "-z", commit)
	cmd.Env = gitEnv()
	stderr := capbuf.New(4 << 10)
	cmd.Stderr = stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, false, err
	}
	if err := cmd.Start(); err != nil {
		return nil, false, fmt.Errorf("start git ls-tree: %w", err)
	}
	entries, truncated, perr := parseLsTree(bufio.NewReaderSize(stdout, 64<<10), m.limits.TreeMaxEntries, m.limits.TreeMaxPathBytes)
	if truncated || perr != nil {
		cancel() // nobody reads the rest
	}
	werr := cmd.Wait()
	switch {
	case perr != nil:
		return nil, false, perr
	case truncated:
		return entries, true, nil
	case werr != nil:
		return nil, false, &GitError{Args: cmd.Args[1:], Stderr: strings.TrimSpace(stderr.String("dropped")), Err: werr}
	}
	return entries, false, nil
}

// parseLsTree parses `git ls-tree -l -z` output: records of
// "<mode> SP <type> SP <object> SP+ <size> TAB <path> NUL", up to
// maxEntries records and maxPathBytes bytes of paths (0: no limit); past
// either it stops and reports the listing truncated.
func parseLsTree(r *bufio.Reader, maxEntries int, maxPathBytes int64) ([]Entry, bool, error) {
	var (
		entries   []Entry
		pathBytes int64
	)
	for {
		rec, err := readRecord(r)
		if errors.Is(err, io.EOF) && len(rec) == 0 {
			return entries, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("ls-tree: %w", err)
		}
		if maxEntries > 0 && len(entries) >= maxEntries {
			return entries, true, nil
		}
		meta, path, ok := bytes.Cut(rec, []byte{'\t'})
		if !ok {
			return nil, false, fmt.Errorf("ls-tree: malformed record %q", rec)
		}
		if pathBytes += int64(len(path)); maxPathBytes > 0 && pathBytes > maxPathBytes {
			return entries, true, nil
		}
		f := bytes.Fields(meta)
		if len(f) != 4 {
			return nil, false, fmt.Errorf("ls-tree: malformed record %q", rec)
		}
		mode, err := strconv.ParseUint(string(f[0]), 8, 32)
		if err != nil {
			return nil, false, fmt.Errorf("ls-tree: mode of %q: %w", rec, err)
		}
		e := Entry{Path: string(path), Type: string(f[1]), Mode: uint32(mode), SHA: string(f[2]), Size: -1}
		if e.Type == "blob" {
			if e.Size, err = strconv.ParseInt(string(f[3]), 10, 64); err != nil {
				return nil, false, fmt.Errorf("ls-tree: size of %q: %w", rec, err)
			}
		}
		entries = append(entries, e)
	}
}

// readRecord reads one NUL-terminated record (without the NUL), at most
// maxTreeRecord bytes long. A record cut by the end of the output is an
// error; the end of the output between records is io.EOF.
func readRecord(r *bufio.Reader) ([]byte, error) {
	var rec []byte
	for {
		chunk, err := r.ReadSlice(0)
		rec = append(rec, chunk...)
		if len(rec) > maxTreeRecord {
			return nil, fmt.Errorf("record longer than %d bytes", maxTreeRecord)
		}
		switch {
		case err == nil:
			return rec[:len(rec)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(rec) == 0:
			return nil, io.EOF
		case errors.Is(err, io.EOF):
			return nil, fmt.Errorf("unterminated record %q", rec)
		}
		return nil, err
	}
}

// lru is a small least-recently-used cache of tree listings. Listings are
// keyed by repository and commit, so they never go stale.
type lru struct {
	mu    sync.Mutex
	max   int
	ll    *list.List
	items map[string]*list.Element
}

type lruItem struct {
	key string
	listing
}

// listing is a cached tree listing.
type listing struct {
	entries   []Entry
	truncated bool
}

func newLRU(max int) *lru {
	return &lru{max: max, ll: list.New(), items: map[string]*list.Element{}}
}

func (c *lru) get(key string) (listing, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return listing{}, false
	}
	c.ll.MoveToFront(el)
	return el.Value.(*lruItem).listing, true
}

func (c *lru) put(key string, l listing) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.ll.MoveToFront(el)
		return
	}
	c.items[key] = c.ll.PushFront(&lruItem{key: key, listing: l})
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.items, old.Value.(*lruItem).key)
	}
}
