package host

// A backend's "ids" directory: one symlink per sandbox id, pointing at
// ../sandboxes/<cid>, the sandbox's own state directory. Creating the link
// is the atomic claim of an id; a sandbox directory that no link points at
// is a leftover (a half-made or unclaimed sandbox).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sandboxd/sandboxd/internal/mountinfo"
	"github.com/sandboxd/sandboxd/internal/runtime"
)

// Dir is a backend's state directory: its ids/ links and sandboxes/.
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

// SandboxDir is the state directory of the sandbox cid.
func (d Dir) SandboxDir(cid string) string { return filepath.Join(string(d), "sandboxes", cid) }

// Claim links id to the sandbox cid: the atomic claim of the id, an error
// wrapping runtime.ErrExists when it is taken.
func (d Dir) Claim(id, cid string) error {
	if err := os.Symlink(filepath.Join("..", "sandboxes", cid), d.Path(id)); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create sandbox %s: %w", id, runtime.ErrExists)
		}
		return fmt.Errorf("create sandbox %s: claim id: %w", id, err)
	}
	return nil
}

// Leftover is a sandbox directory found by Scan.
type Leftover struct {
	CID, Dir string
	// ClaimedBy is the id linked to it, "" when none is (a half-made or
	// unclaimed sandbox).
	ClaimedBy string
}

// Scan lists the sandbox directories an earlier process left, with the
// id that claims each, for a backend's reattach.
func (d Dir) Scan() ([]Leftover, error) {
	ents, err := os.ReadDir(filepath.Join(string(d), "sandboxes"))
	if err != nil {
		return nil, fmt.Errorf("scan sandboxes: %w", err)
	}
	claimed := d.Claims() // cid -> id
	out := make([]Leftover, 0, len(ents))
	for _, e := range ents {
		out = append(out, Leftover{CID: e.Name(), Dir: d.SandboxDir(e.Name()), ClaimedBy: claimed[e.Name()]})
	}
	return out, nil
}

// Remove deletes the state directory dir of sandbox cid once nothing is
// mounted under it any more (else it is an error: the mounts would be
// deleted through), and id's link if it still points at cid.
func (d Dir) Remove(dir, id, cid string) error {
	var err error
	if mounts, _ := mountinfo.Under(dir); len(mounts) == 0 {
		err = os.RemoveAll(dir)
	} else {
		err = fmt.Errorf("mounts remain under %s", dir)
	}
	if id != "" {
		link := d.Path(id)
		if t, lerr := os.Readlink(link); lerr == nil && filepath.Base(t) == cid {
			_ = os.Remove(link)
		}
	}
	return err
}
