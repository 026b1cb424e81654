// Package forge connects sandboxd to a code forge — GitHub — as an optional
// mirror of the accounts' repositories and as the place where the
// coding-agent task opens pull requests. sandboxd's own repositories (package
// repo) stay the source of truth; a forge only receives copies.
//
// It owns three things:
//   - Forge, a small interface over the forge's API (ensure a repository,
//     open a pull request, recognise the forge's URLs), and GitHub, its
//     implementation on go-github.
//   - Push, which pushes from a local bare repository to an HTTPS remote
//     with a token.
//   - Mirror, which keeps one forge repository per account up to date with
//     the account's bare repository.
//
// Invariants:
//   - A token never reaches disk, a repository's config, a process's
//     arguments or an error message: git receives it through a credential
//     helper that reads it from an environment variable of the git process
//     (see CredentialHelper), and every error text passes through redaction.
//   - Credentials are sent only over https, or over plain http to a loopback
//     address (tests); remote URLs carrying credentials are refused.
//   - Nothing here loses commits on the forge: a mirror push moves a forge
//     branch only when the forge's commit is contained in what is pushed, or
//     is the commit this mirror pushed there last (recorded in the local
//     repository under refs/forge/). A branch that moved on the forge
//     (a pull request merged there, say) is left alone and reported.
//   - Talking to a real forge needs network access; every test here runs
//     against loopback stand-ins.
package forge

import (
	"context"
	"errors"
	"net/url"
	"strings"
)

// Forge is a code forge holding repositories under one configured owner.
type Forge interface {
	// EnsureRepo returns the repository name of the configured owner,
	// creating it (empty, with description, private or public) when it
	// does not exist. An existing repository is returned as it is.
	EnsureRepo(ctx context.Context, name, description string, private bool) (Repo, error)
	// OpenPullRequest opens a pull request in the repository fullName
	// ("owner/name") or, when one is already open for the same head and
	// base, returns that one.
	OpenPullRequest(ctx context.Context, fullName string, pr PullRequest) (PR, error)
	// ParseRepoURL reports whether u is the web or clone URL of a
	// repository on this forge, and which ("owner/name").
	ParseRepoURL(u string) (fullName string, ok bool)
}

// Repo is a repository on a forge.
type Repo struct {
	// CloneURL is the HTTPS URL git clones and pushes.
	CloneURL string
	// HTMLURL is the repository's web page.
	HTMLURL string
	// FullName is "owner/name".
	FullName string
	// DefaultBranch is the branch the forge shows and pull requests target
	// by default.
	DefaultBranch string
}

// PullRequest is what to open.
type PullRequest struct {
	// Head is the branch with the changes: "branch" in the same
	// repository, or "owner:branch" in a fork.
	Head string
	// Base is the branch to merge into.
	Base  string
	Title string
	Body  string
}

// PR is an open pull request.
type PR struct {
	Number  int
	HTMLURL string
}

// Errors of the package, matched with errors.Is; they come wrapped with
// what was being done and the forge's message.
var (
	// ErrNotFound: the repository (or owner) does not exist, or the token
	// may not see it.
	ErrNotFound = errors.New("not found on forge")
	// ErrUnauthorized: the forge rejected the token.
	ErrUnauthorized = errors.New("forge rejected the token")
	// ErrForbidden: the token may not do this, or a rate limit was hit.
	ErrForbidden = errors.New("forbidden by forge")
	// ErrInvalid: the forge refused the request as invalid (a name it does
	// not accept, a pull request with no commits, ...).
	ErrInvalid = errors.New("refused by forge")
)

// redacted replaces secrets in text shown to people.
const redacted = "[REDACTED]"

// redact removes token and any credentials embedded in URLs from s.
func redact(s, token string) string {
	if token != "" {
		s = strings.ReplaceAll(s, token, redacted)
	}
	return redactUserinfo(s)
}

// redactUserinfo hides the user information of every URL in s
// ("https://user:secret@host/..." becomes "https://[REDACTED]@host/...").
func redactUserinfo(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i+3])
		s = s[i+3:]
		// The authority ends at the first '/', '?', '#' or space; user
		// information is what precedes its last '@'.
		end := strings.IndexAny(s, "/?# \t\n'\"")
		if end < 0 {
			end = len(s)
		}
		if at := strings.LastIndexByte(s[:end], '@'); at >= 0 {
			b.WriteString(redacted)
			s = s[at:]
		}
	}
}

// checkRemote refuses URLs a token must not be sent to: anything but https,
// except http to a loopback host, and URLs with credentials in them (git
// would use those instead of the helper, and they would show in process
// arguments).
func checkRemote(remote string) error {
	u, err := url.Parse(remote)
	if err != nil {
		return errors.New("remote URL is malformed")
	}
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && isLoopback(u.Hostname()):
	case u.Scheme == "http":
		return errors.New("remote URL must use https: a token is never sent in the clear")
	default:
		return errors.New("remote URL must use https")
	}
	if u.User != nil {
		return errors.New("remote URL must not carry credentials")
	}
	if u.Host == "" {
		return errors.New("remote URL has no host")
	}
	return nil
}
