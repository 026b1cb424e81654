package forge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/google/go-github/v75/github"
)

// DefaultAPIBase and DefaultWebHost are GitHub's own.
const (
	DefaultAPIBase = "https://api.github.com/"
	DefaultWebHost = "github.com"
)

// Options configure a GitHub forge.
type Options struct {
	// Token authenticates every API call (a personal access token or an
	// app installation token with the repository scopes). Required.
	Token string
	// Owner is the organization or user the repositories belong to. A user
	// owner must be the token's own user: GitHub creates repositories only
	// for the authenticated user or in an organization.
	Owner string
	// BaseURL is the REST API's base URL (default DefaultAPIBase; GitHub
	// Enterprise Server's is "https://HOST/api/v3/").
	BaseURL string
	// WebHost is the host of the forge's web and clone URLs (default
	// DefaultWebHost); ParseRepoURL recognises URLs on it.
	WebHost string
	// HTTPClient carries the API calls (default a client with no timeout of
	// its own: every call is bounded by its context).
	HTTPClient *http.Client
	Logger     *slog.Logger
}

// GitHub is a Forge on GitHub's REST API. It is safe for concurrent use.
type GitHub struct {
	client  *github.Client
	owner   string
	webHost string
	token   string
	log     *slog.Logger

	// mu guards isOrg: whether the owner is an organization is looked up
	// once (on the first creation) and kept.
	mu    sync.Mutex
	isOrg *bool
}

var _ Forge = (*GitHub)(nil)

// NewGitHub returns a GitHub forge for opts.
func NewGitHub(opts Options) (*GitHub, error) {
	if opts.Token == "" {
		return nil, errors.New("forge: a GitHub token is required")
	}
	if !validOwner(opts.Owner) {
		return nil, fmt.Errorf("forge: GitHub owner %q is not a valid user or organization name", opts.Owner)
	}
	if opts.BaseURL == "" {
		opts.BaseURL = DefaultAPIBase
	}
	base, err := url.Parse(opts.BaseURL)
	if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
		return nil, fmt.Errorf("forge: GitHub API base URL %q is not an http(s) URL", opts.BaseURL)
	}
	if base.Scheme == "http" && !isLoopback(base.Hostname()) {
		return nil, fmt.Errorf("forge: GitHub API base URL %q must use https: the token is never sent in the clear", opts.BaseURL)
	}
	if !strings.HasSuffix(base.Path, "/") {
		base.Path += "/" // go-github resolves paths relative to it
	}
	if opts.WebHost == "" {
		opts.WebHost = DefaultWebHost
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	client := github.NewClient(opts.HTTPClient).WithAuthToken(opts.Token)
	client.BaseURL = base
	return &GitHub{
		client:  client,
		owner:   opts.Owner,
		webHost: strings.ToLower(opts.WebHost),
		token:   opts.Token,
		log:     opts.Logger,
	}, nil
}

// Owner is the configured owner.
func (g *GitHub) Owner() string { return g.owner }

// WebHost is the host of the forge's web and clone URLs.
func (g *GitHub) WebHost() string { return g.webHost }

// EnsureRepo implements Forge. It looks the repository up first (the
// common case once it exists costs one call), creates it when missing, and
// returns the existing one when a concurrent creation won the race.
func (g *GitHub) EnsureRepo(ctx context.Context, name, description string, private bool) (Repo, error) {
	if !validRepoName(name) {
		return Repo{}, fmt.Errorf("ensure repository %q: %w: not a valid repository name", name, ErrInvalid)
	}
	full := g.owner + "/" + name
	r, err := g.getRepo(ctx, name)
	if err == nil {
		return r, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return Repo{}, fmt.Errorf("ensure repository %s: %w", full, err)
	}
	org, err := g.ownerIsOrg(ctx)
	if err != nil {
		return Repo{}, fmt.Errorf("ensure repository %s: %w", full, err)
	}
	in := ""
	if org {
		in = g.owner // POST /orgs/{org}/repos; "" is POST /user/repos
	}
	created, _, err := g.client.Repositories.Create(ctx, in, &github.Repository{
		Name:        github.Ptr(name),
		Description: github.Ptr(description),
		Private:     github.Ptr(private),
		// Empty: the first push brings the history.
		AutoInit: github.Ptr(false),
	})
	if err == nil {
		g.log.InfoContext(ctx, "created forge repository", "repo", created.GetFullName(), "private", private)
		return repoOf(created), nil
	}
	if alreadyExists(err) {
		// Created meanwhile (by another node, or a request in flight).
		r, gerr := g.getRepo(ctx, name)
		if gerr != nil {
			return Repo{}, fmt.Errorf("ensure repository %s: exists but cannot be read: %w", full, gerr)
		}
		return r, nil
	}
	return Repo{}, fmt.Errorf("ensure repository %s: %w", full, g.mapErr("create repository", err))
}

func (g *GitHub) getRepo(ctx context.Context, name string) (Repo, error) {
	r, _, err := g.client.Repositories.Get(ctx, g.owner, name)
	if err != nil {
		return Repo{}, g.mapErr("get repository", err)
	}
	return repoOf(r), nil
}

// ownerIsOrg tells whether the owner is an organization. A user owner must
// be the token's user, since GitHub offers no way to create a repository
// for another user; finding that out here gives a clear error instead of a
// repository created in the wrong place.
func (g *GitHub) ownerIsOrg(ctx context.Context) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.isOrg != nil {
		return *g.isOrg, nil
	}
	u, _, err := g.client.Users.Get(ctx, g.owner)
	if err != nil {
		return false, fmt.Errorf("look up owner %s: %w", g.owner, g.mapErr("get user", err))
	}
	org := u.GetType() == "Organization"
	if !org {
		me, _, err := g.client.Users.Get(ctx, "")
		if err != nil {
			return false, fmt.Errorf("look up the token's user: %w", g.mapErr("get authenticated user", err))
		}
		if !strings.EqualFold(me.GetLogin(), g.owner) {
			return false, fmt.Errorf("owner %s is a user other than the token's (%s): %w: repositories can be created only for the token's user or in an organization",
				g.owner, me.GetLogin(), ErrForbidden)
		}
	}
	g.isOrg = &org
	return org, nil
}

// OpenPullRequest implements Forge. It tries to create the pull request
// first (one call in the common case); when GitHub answers that one already
// exists for the head, it finds and returns that one.
func (g *GitHub) OpenPullRequest(ctx context.Context, fullName string, pr PullRequest) (PR, error) {
	owner, name, ok := strings.Cut(fullName, "/")
	if !ok || !validOwner(owner) || !validRepoName(name) {
		return PR{}, fmt.Errorf("open pull request in %q: %w: not an owner/name", fullName, ErrInvalid)
	}
	if pr.Head == "" || pr.Base == "" || pr.Title == "" {
		return PR{}, fmt.Errorf("open pull request in %s: %w: head, base and title are required", fullName, ErrInvalid)
	}
	what := fmt.Sprintf("open pull request %s into %s in %s", pr.Head, pr.Base, fullName)
	created, _, err := g.client.PullRequests.Create(ctx, owner, name, &github.NewPullRequest{
		Title: github.Ptr(pr.Title),
		Head:  github.Ptr(pr.Head),
		Base:  github.Ptr(pr.Base),
		Body:  github.Ptr(pr.Body),
	})
	if err == nil {
		g.log.InfoContext(ctx, "opened pull request", "repo", fullName, "number", created.GetNumber(), "head", pr.Head)
		return PR{Number: created.GetNumber(), HTMLURL: created.GetHTMLURL()}, nil
	}
	if !alreadyExists(err) {
		return PR{}, fmt.Errorf("%s: %w", what, g.mapErr("create pull request", err))
	}
	// The list filter wants "owner:branch" for the head.
	head := pr.Head
	if !strings.Contains(head, ":") {
		head = owner + ":" + head
	}
	open, _, err := g.client.PullRequests.List(ctx, owner, name, &github.PullRequestListOptions{
		State: "open", Head: head, Base: pr.Base,
	})
	if err != nil {
		return PR{}, fmt.Errorf("%s: one exists, but listing failed: %w", what, g.mapErr("list pull requests", err))
	}
	if len(open) == 0 {
		return PR{}, fmt.Errorf("%s: GitHub says one exists, but none is open for %s", what, head)
	}
	return PR{Number: open[0].GetNumber(), HTMLURL: open[0].GetHTMLURL()}, nil
}

// ParseRepoURL implements Forge: https://HOST/OWNER/NAME, optionally with
// ".git" or a trailing slash, on the configured web host.
func (g *GitHub) ParseRepoURL(raw string) (string, bool) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Scheme != "https" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	if !strings.EqualFold(u.Host, g.webHost) {
		return "", false
	}
	p := strings.TrimSuffix(strings.TrimPrefix(u.Path, "/"), "/")
	owner, name, ok := strings.Cut(p, "/")
	if !ok {
		return "", false
	}
	name = strings.TrimSuffix(name, ".git")
	if !validOwner(owner) || !validRepoName(name) {
		return "", false
	}
	return owner + "/" + name, true
}

func repoOf(r *github.Repository) Repo {
	branch := r.GetDefaultBranch()
	if branch == "" {
		branch = "main"
	}
	return Repo{
		CloneURL:      r.GetCloneURL(),
		HTMLURL:       r.GetHTMLURL(),
		FullName:      r.GetFullName(),
		DefaultBranch: branch,
	}
}

// alreadyExists tells whether err is GitHub's 422 answer to creating
// something that exists: "name already exists on this account" for a
// repository, "A pull request already exists for owner:branch." for a pull
// request.
func alreadyExists(err error) bool {
	var er *github.ErrorResponse
	if !errors.As(err, &er) || er.Response == nil || er.Response.StatusCode != http.StatusUnprocessableEntity {
		return false
	}
	if strings.Contains(er.Message, "already exists") {
		return true
	}
	for _, e := range er.Errors {
		if strings.Contains(e.Message, "already exists") || e.Code == "already_exists" {
			return true
		}
	}
	return false
}

// mapErr turns a go-github error into one of the package's errors, with
// GitHub's message (and never the token) in it.
func (g *GitHub) mapErr(op string, err error) error {
	var (
		rate  *github.RateLimitError
		abuse *github.AbuseRateLimitError
		er    *github.ErrorResponse
	)
	switch {
	case errors.As(err, &rate):
		return fmt.Errorf("%s: %w: rate limit exceeded, resets at %s", op, ErrForbidden, rate.Rate.Reset.UTC().Format("15:04:05Z"))
	case errors.As(err, &abuse):
		return fmt.Errorf("%s: %w: secondary rate limit: %s", op, ErrForbidden, g.redact(abuse.Message))
	case errors.As(err, &er) && er.Response != nil:
		msg := g.redact(errorText(er))
		switch er.Response.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%s: %w: %s", op, ErrNotFound, msg)
		case http.StatusUnauthorized:
			return fmt.Errorf("%s: %w: %s", op, ErrUnauthorized, msg)
		case http.StatusForbidden:
			return fmt.Errorf("%s: %w: %s", op, ErrForbidden, msg)
		case http.StatusUnprocessableEntity, http.StatusBadRequest, http.StatusConflict:
			return fmt.Errorf("%s: %w: %s", op, ErrInvalid, msg)
		default:
			return fmt.Errorf("%s: GitHub answered %d: %s", op, er.Response.StatusCode, msg)
		}
	default:
		// Transport errors: the text names the URL, never headers, but
		// redact anyway in case a caller's client adds more.
		return fmt.Errorf("%s: %s", op, g.redact(err.Error()))
	}
}

func (g *GitHub) redact(s string) string { return redact(s, g.token) }

// errorText is GitHub's message with the details of its errors list.
func errorText(er *github.ErrorResponse) string {
	parts := []string{er.Message}
	for _, e := range er.Errors {
		switch {
		case e.Message != "":
			parts = append(parts, e.Message)
		case e.Code != "":
			parts = append(parts, fmt.Sprintf("%s %s: %s", e.Resource, e.Field, e.Code))
		}
	}
	return strings.Join(parts, "; ")
}

// validOwner: GitHub user and organization names are 1-39 ASCII letters,
// digits and single hyphens, not starting or ending with a hyphen.
func validOwner(s string) bool {
	if s == "" || len(s) > 39 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// validRepoName: GitHub repository names are up to 100 ASCII letters,
// digits, '-', '_' and '.', and not "." or "..". Names ending in ".git"
// are refused too: the suffix is ambiguous in clone URLs.
func validRepoName(s string) bool {
	if s == "" || len(s) > 100 || s == "." || s == ".." || strings.HasSuffix(s, ".git") {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}
