package repo

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
	"strconv"
	"sync"
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
// The listing is `git ls-tree -r -t -l` (the fastest way to get sizes: one
// process, object headers read in C) cached per commit, so repeated
// listings of an unchanged branch cost one reference lookup.
func (m *Manager) Tree(ctx context.Context, accountID string) ([]Entry, error) {
	p, err := m.existing(accountID)
	if err != nil {
		return nil, err
	}
	st := openStorage(p)
	head, err := branchHead(st, MainBranch)
	st.Close()
	if err != nil {
		return nil, fmt.Errorf("tree of %s: %w", accountID, err)
	}
	if head.IsZero() {
		return []Entry{}, nil
	}
	key := p + "\x00" + head.String()
	if cached, ok := m.treeCache.get(key); ok {
		return append([]Entry(nil), cached...), nil
	}
	out, err := m.run(ctx, p, nil, "ls-tree", "-r", "-t", "-l", "-z", head.String())
	if err != nil {
		return nil, fmt.Errorf("tree of %s at %s: %w", accountID, head, err)
	}
	entries, err := parseLsTree(out)
	if err != nil {
		return nil, fmt.Errorf("tree of %s at %s: %w", accountID, head, err)
	}
	m.treeCache.put(key, entries)
	return append([]Entry(nil), entries...), nil
}

// parseLsTree parses `git ls-tree -l -z` output: records of
// "<mode> SP <type> SP <object> SP+ <size> TAB <path> NUL".
func parseLsTree(out []byte) ([]Entry, error) {
	entries := make([]Entry, 0, bytes.Count(out, []byte{0}))
	for len(out) > 0 {
		i := bytes.IndexByte(out, 0)
		if i < 0 {
			return nil, fmt.Errorf("ls-tree: unterminated record %q", out)
		}
		rec := out[:i]
		out = out[i+1:]
		meta, path, ok := bytes.Cut(rec, []byte{'\t'})
		if !ok {
			return nil, fmt.Errorf("ls-tree: malformed record %q", rec)
		}
		f := bytes.Fields(meta)
		if len(f) != 4 {
			return nil, fmt.Errorf("ls-tree: malformed record %q", rec)
		}
		mode, err := strconv.ParseUint(string(f[0]), 8, 32)
		if err != nil {
			return nil, fmt.Errorf("ls-tree: mode of %q: %w", rec, err)
		}
		e := Entry{Path: string(path), Type: string(f[1]), Mode: uint32(mode), SHA: string(f[2]), Size: -1}
		if e.Type == "blob" {
			if e.Size, err = strconv.ParseInt(string(f[3]), 10, 64); err != nil {
				return nil, fmt.Errorf("ls-tree: size of %q: %w", rec, err)
			}
		}
		entries = append(entries, e)
	}
	return entries, nil
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
	key     string
	entries []Entry
}

func newLRU(max int) *lru {
	return &lru{max: max, ll: list.New(), items: map[string]*list.Element{}}
}

func (c *lru) get(key string) ([]Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.items[key]
	if !ok {
		return nil, false
	}
	c.ll.MoveToFront(el)
	return el.Value.(*lruItem).entries, true
}

func (c *lru) put(key string, entries []Entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[key]; ok {
		c.ll.MoveToFront(el)
		return
	}
	c.items[key] = c.ll.PushFront(&lruItem{key: key, entries: entries})
	for c.ll.Len() > c.max {
		old := c.ll.Back()
		c.ll.Remove(old)
		delete(c.items, old.Value.(*lruItem).key)
	}
}
