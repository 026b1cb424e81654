package forge

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// ErrNotOwned: a URL names a repository on the forge that is not the
// account's own mirror. sandboxd's token must never push to it, open pull
// requests in it or be used for it on a tenant's behalf: any repository
// the token can reach is not any tenant's to name.
var ErrNotOwned = errors.New("not the account's repository on the forge")

// ownerForge is what OwnsRepo needs beyond Forge: the configured owner
// and web host (GitHub has both).
type ownerForge interface {
	Owner() string
	WebHost() string
}

// OwnsRepo checks a repository URL that accountID names (PATCH
// github_repo, a coding agent's repo_url): nil when it is not on the
// forge's host at all (sandboxd's own repositories, other hosts: no forge
// credential is ever used for those), or when it is the account's own
// mirror (OWNER/NamePrefix+accountID, its web or clone URL); otherwise an
// error wrapping ErrNotOwned that says which repository the account may
// name. A nil Mirror (no forge configured) accepts every URL: there is no
// credential to misuse.
func (m *Mirror) OwnsRepo(accountID, rawURL string) error {
	if m == nil {
		return nil
	}
	of, ok := m.opts.Forge.(ownerForge)
	if !ok {
		return fmt.Errorf("%w: the forge has no configured owner", ErrNotOwned)
	}
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil {
		return fmt.Errorf("%w: the URL does not parse", ErrNotOwned)
	}
	// Scp-like addresses (git@host:owner/name) do not parse: refused above.
	// Any port on the forge's host is still the forge.
	host := u.Host
	if !strings.Contains(of.WebHost(), ":") {
		host = u.Hostname()
	}
	host = strings.TrimPrefix(strings.ToLower(host), "www.")
	if host != strings.ToLower(of.WebHost()) {
		return nil
	}
	want := of.Owner() + "/" + m.RepoName(accountID)
	full, ok := m.opts.Forge.ParseRepoURL(rawURL)
	if ok && strings.EqualFold(full, want) {
		return nil
	}
	return fmt.Errorf("%w: on %s this account may only name its own mirror https://%s/%s", ErrNotOwned, of.WebHost(), of.WebHost(), want)
}
