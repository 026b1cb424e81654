package repo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"path"
	"sort"
	"strings"

	"github.com/go-git/go-git/v5/config"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// maxSubmoduleDepth bounds how deep submodules are followed, so that
// repositories naming each other cannot loop forever.
const maxSubmoduleDepth = 8

// submodule is one valid entry of a .gitmodules file.
type submodule struct {
	Path   string
	URL    string
	Branch string
}

// maxGitmodulesBytes bounds the .gitmodules file read.
const maxGitmodulesBytes = 1 << 20

// modulesOf parses the .gitmodules of tree (whose objects are in st); a
// tree without one has no submodules. Entries git itself would refuse
// (empty or escaping paths, suspicious names) are ignored, and so is a
// .gitmodules larger than 1 MiB: its size is read from the object's header
// before anything is inflated.
func modulesOf(st *filesystem.Storage, tree *object.Tree) ([]submodule, error) {
	e, err := tree.FindEntry(".gitmodules")
	if errors.Is(err, object.ErrEntryNotFound) || errors.Is(err, object.ErrFileNotFound) || errors.Is(err, object.ErrDirectoryNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read .gitmodules: %w", err)
	}
	if !e.Mode.IsFile() {
		return nil, nil
	}
	size, err := st.EncodedObjectSize(e.Hash)
	if err != nil {
		return nil, fmt.Errorf("read .gitmodules: %w", err)
	}
	if size > maxGitmodulesBytes {
		return nil, nil
	}
	blob, err := object.GetBlob(st, e.Hash)
	if err != nil {
		return nil, fmt.Errorf("read .gitmodules: %w", err)
	}
	r, err := blob.Reader()
	if err != nil {
		return nil, fmt.Errorf("read .gitmodules: %w", err)
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, maxGitmodulesBytes))
	if err != nil {
		return nil, fmt.Errorf("read .gitmodules: %w", err)
	}
	mods := config.NewModules()
	if err := mods.Unmarshal(data); err != nil {
		return nil, fmt.Errorf("parse .gitmodules: %w", err)
	}
	var out []submodule
	for _, s := range mods.Submodules {
		if s.Validate() != nil {
			continue
		}
		p := strings.Trim(path.Clean("/"+s.Path), "/")
		if p == "" {
			continue
		}
		out = append(out, submodule{Path: p, URL: strings.TrimSpace(s.URL), Branch: s.Branch})
	}
	// Longest path first: the most specific submodule wins.
	sort.Slice(out, func(i, j int) bool {
		if len(out[i].Path) != len(out[j].Path) {
			return len(out[i].Path) > len(out[j].Path)
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

// gitlink returns the commit tree records for the submodule at p, and
// whether tree has a gitlink there.
func gitlink(tree *object.Tree, p string) (string, bool) {
	e, err := tree.FindEntry(p)
	if err != nil || e.Mode != filemode.Submodule {
		return "", false
	}
	return e.Hash.String(), true
}

// localURL is a base URL of this server.
type localURL struct {
	host   string // lowercase host:port, default ports made explicit
	prefix string // path before /git/, without a trailing slash
}

func parseLocalURL(s string) (localURL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return localURL{}, err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return localURL{}, errors.New("want an http or https URL with a host")
	}
	return localURL{host: hostPort(u), prefix: strings.TrimRight(u.Path, "/")}, nil
}

func hostPort(u *url.URL) string {
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return net.JoinHostPort(host, port)
}

// ownerOf returns the account whose repository hosted here a submodule URL
// names. Relative URLs are relative to the repository of account base, as
// git resolves them against the superproject's URL (/git/<base>.git).
func (m *Manager) ownerOf(base, raw string) (string, error) {
	var p string
	switch {
	case strings.HasPrefix(raw, "./") || strings.HasPrefix(raw, "../"):
		p = path.Join("/git/"+base+".git", raw)
	default:
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
			return "", fmt.Errorf("submodule URL %q is not hosted here: %w", redactURL(raw), ErrNotFound)
		}
		hp, clean := hostPort(u), path.Clean("/"+u.Path)
		for _, l := range m.local {
			if hp == l.host && strings.HasPrefix(clean, l.prefix+"/git/") {
				p = strings.TrimPrefix(clean, l.prefix)
				break
			}
		}
		if p == "" {
			return "", fmt.Errorf("submodule URL %q is not hosted here: %w", redactURL(raw), ErrNotFound)
		}
	}
	name, ok := strings.CutPrefix(p, "/git/")
	if !ok || strings.Contains(name, "/") {
		return "", fmt.Errorf("submodule URL %q is not hosted here: %w", redactURL(raw), ErrNotFound)
	}
	id, err := CanonicalID(strings.TrimSuffix(name, ".git"))
	if err != nil {
		return "", fmt.Errorf("submodule URL %q is not hosted here: %w", redactURL(raw), ErrNotFound)
	}
	return id, nil
}

// submoduleRepo returns the owner and path of the repository submodule sub
// of account base's repository leads to, if account (the one reading or
// writing) may use it so. A write refused where a read would be allowed is
// ErrReadOnly; a repository the account may not even read is ErrNotFound,
// so that ids cannot be probed.
func (m *Manager) submoduleRepo(ctx context.Context, account, base string, sub submodule, use Use) (string, string, error) {
	owner, err := m.ownerOf(base, sub.URL)
	if err != nil {
		return "", "", fmt.Errorf("submodule %s: %w", sub.Path, err)
	}
	if owner != account {
		ok, err := m.mayUse(ctx, account, owner, use)
		if err != nil {
			return "", "", fmt.Errorf("submodule %s: %w", sub.Path, err)
		}
		if !ok && use == UseWrite {
			if readable, err := m.mayUse(ctx, account, owner, UseRead); err != nil {
				return "", "", fmt.Errorf("submodule %s: %w", sub.Path, err)
			} else if readable {
				return "", "", fmt.Errorf("submodule %s: repository of %s: %w", sub.Path, owner, ErrReadOnly)
			}
		}
		if !ok {
			return "", "", fmt.Errorf("submodule %s: repository of %s: %w", sub.Path, owner, ErrNotFound)
		}
	}
	p, err := m.existing(ctx, owner)
	if errors.Is(err, ErrNoRepository) {
		return "", "", fmt.Errorf("submodule %s: repository of %s: %w", sub.Path, owner, ErrNotFound)
	}
	if err != nil {
		return "", "", err
	}
	return owner, p, nil
}

// mayUse asks the access rule; without one only the account's own
// repository may be used.
func (m *Manager) mayUse(ctx context.Context, account, owner string, use Use) (bool, error) {
	if owner == account {
		return true, nil
	}
	if m.access == nil {
		return false, nil
	}
	ok, err := m.access.MayUseRepository(ctx, account, owner, use)
	if err != nil {
		return false, fmt.Errorf("check access of %s to %s: %w", account, owner, err)
	}
	return ok, nil
}

// redactURL drops credentials from a URL for messages.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	u.User = nil
	return u.String()
}
