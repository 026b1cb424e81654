// Package idlinks owns a backend's "ids" directory: one symlink per sandbox
// id, pointing at ../sandboxes/<cid>, the sandbox's own state directory.
// Creating the link is the atomic claim of an id; a sandbox directory that
// no link points at is a leftover (a half-made or unclaimed sandbox).
package idlinks

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Dir is the ids directory of the state directory it names.
type Dir string

// Path is the link of sandbox id.
func (d Dir) Path(id string) string { return filepath.Join(string(d), "ids", id) }

// CID returns the state directory name (container id) that id is linked to,
// or an error wrapping runtime.ErrNotFound.
func (d Dir) CID(id string) (string, error) {
	target, err := os.Readlink(d.Path(id))
	if err != nil {
		return "", fmt.Errorf("get sandbox %s: %w", id, runtime.ErrNotFound)
	}
	return filepath.Base(target), nil
}

// List returns every claimed id.
func (d Dir) List() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(string(d), "ids"))
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	ids := make([]string, 0, len(ents))
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids, nil
}

// Claims maps the container ids under sandboxes/ that are claimed to their
// sandbox ids. Links whose sandbox directory is gone are removed.
func (d Dir) Claims() map[string]string {
	root := filepath.Join(string(d), "sandboxes")
	claimed := map[string]string{}
	links, err := os.ReadDir(filepath.Join(string(d), "ids"))
	if err != nil {
		return claimed
	}
	for _, l := range links {
		p := d.Path(l.Name())
		t, err := os.Readlink(p)
		if err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(root, filepath.Base(t))); err != nil {
			_ = os.Remove(p) // dangling: its sandbox is gone
			continue
		}
		claimed[filepath.Base(t)] = l.Name()
	}
	return claimed
}
