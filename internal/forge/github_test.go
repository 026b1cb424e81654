package forge

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

const testToken = "ghp_testtoken0123456789abcdefABCDEF"

func newTestGitHub(t *testing.T, f *fakeGitHub, owner, token string) *GitHub {
	t.Helper()
	g, err := NewGitHub(Options{Token: token, Owner: owner, BaseURL: f.URL})
	if err != nil {
		t.Fatalf("NewGitHub: %v", err)
	}
	return g
}

func TestEnsureRepo(t *testing.T) {
	tests := []struct {
		name    string
		owner   string
		token   string
		repo    string
		private bool
		// setup prepares the fake before the call.
		setup    func(f *fakeGitHub)
		wantErr  error
		wantFull string
		// wantCalls are the API requests the call makes, in order.
		wantCalls []string
	}{
		{
			name: "org owner, missing repository is created in the org", owner: "acme", token: testToken,
			repo: "sandbox-1", private: true, wantFull: "acme/sandbox-1",
			wantCalls: []string{"GET /repos/acme/sandbox-1", "GET /users/acme", "POST /orgs/acme/repos"},
		},
		{
			name: "user owner, missing repository is created for the user", owner: "octo", token: testToken,
			repo: "sandbox-2", wantFull: "octo/sandbox-2",
			wantCalls: []string{"GET /repos/octo/sandbox-2", "GET /users/octo", "GET /user", "POST /user/repos"},
		},
		{
			name: "existing repository is returned without creating", owner: "acme", token: testToken,
			repo: "sandbox-3", wantFull: "acme/sandbox-3",
			setup: func(f *fakeGitHub) {
				f.repos["acme/sandbox-3"] = fakeRepo{Name: "sandbox-3", FullName: "acme/sandbox-3", Private: true}
			},
			wantCalls: []string{"GET /repos/acme/sandbox-3"},
		},
		{
			name: "created concurrently: 422 name already exists returns the existing one", owner: "acme", token: testToken,
			repo: "sandbox-4", wantFull: "acme/sandbox-4",
			setup: func(f *fakeGitHub) {
				f.repos["acme/sandbox-4"] = fakeRepo{Name: "sandbox-4", FullName: "acme/sandbox-4"}
				f.hideNext = true
			},
			wantCalls: []string{"GET /repos/acme/sandbox-4", "GET /users/acme", "POST /orgs/acme/repos", "GET /repos/acme/sandbox-4"},
		},
		{
			name: "a user other than the token's cannot own new repositories", owner: "someone-else", token: testToken,
			repo: "sandbox-5", wantErr: ErrForbidden,
			wantCalls: []string{"GET /repos/someone-else/sandbox-5", "GET /users/someone-else", "GET /user"},
		},
		{
			name: "unknown owner", owner: "nobody", token: testToken,
			repo: "sandbox-6", wantErr: ErrNotFound,
			wantCalls: []string{"GET /repos/nobody/sandbox-6", "GET /users/nobody"},
		},
		{
			name: "bad token", owner: "acme", token: "ghp_wrongtoken_secret_value",
			repo: "sandbox-7", wantErr: ErrUnauthorized,
			wantCalls: []string{"GET /repos/acme/sandbox-7"},
		},
		{
			name: "invalid name makes no call", owner: "acme", token: testToken,
			repo: "bad/name", wantErr: ErrInvalid,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeGitHub(t, testToken, "octo", "acme")
			if tt.setup != nil {
				tt.setup(f)
			}
			g := newTestGitHub(t, f, tt.owner, tt.token)
			r, err := g.EnsureRepo(context.Background(), tt.repo, "a description", tt.private)
			if calls := f.takeRequests(); !slices.Equal(calls, tt.wantCalls) {
				t.Errorf("calls = %q, want %q", calls, tt.wantCalls)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), tt.token) {
					t.Errorf("error reveals the token: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("EnsureRepo: %v", err)
			}
			want := Repo{
				CloneURL:      "https://github.com/" + tt.wantFull + ".git",
				HTMLURL:       "https://github.com/" + tt.wantFull,
				FullName:      tt.wantFull,
				DefaultBranch: "main",
			}
			if r != want {
				t.Errorf("repo = %+v, want %+v", r, want)
			}
			if got := f.repos[tt.wantFull]; got.Private != tt.private && tt.setup == nil {
				t.Errorf("created private = %v, want %v", got.Private, tt.private)
			}
		})
	}
}

func TestEnsureRepoLooksUpOwnerOnce(t *testing.T) {
	f := newFakeGitHub(t, testToken, "octo", "acme")
	g := newTestGitHub(t, f, "acme", testToken)
	ctx := context.Background()
	for _, name := range []string{"a", "b"} {
		if _, err := g.EnsureRepo(ctx, name, "", true); err != nil {
			t.Fatal(err)
		}
	}
	calls := f.takeRequests()
	if n := slices.Index(calls, "GET /users/acme"); n < 0 || slices.Contains(calls[n+1:], "GET /users/acme") {
		t.Errorf("owner not looked up exactly once: %q", calls)
	}
	// A second EnsureRepo of an existing repository is one call.
	if _, err := g.EnsureRepo(ctx, "a", "", true); err != nil {
		t.Fatal(err)
	}
	if calls := f.takeRequests(); len(calls) != 1 {
		t.Errorf("ensure of an existing repository made %d calls: %q", len(calls), calls)
	}
}

func TestOpenPullRequest(t *testing.T) {
	ctx := context.Background()
	f := newFakeGitHub(t, testToken, "octo", "acme")
	f.repos["acme/app"] = fakeRepo{Name: "app", FullName: "acme/app"}
	g := newTestGitHub(t, f, "acme", testToken)

	first, err := g.OpenPullRequest(ctx, "acme/app", PullRequest{Head: "agent/run_1", Base: "main", Title: "Fix it", Body: "Details"})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	if first.Number != 1 || first.HTMLURL != "https://github.com/acme/app/pull/1" {
		t.Errorf("pr = %+v", first)
	}
	if p := f.pulls["acme/app"][0]; p.Head != "acme:agent/run_1" || p.Title != "Fix it" || p.Body != "Details" {
		t.Errorf("fake got %+v", p)
	}
	f.takeRequests()

	tests := []struct {
		name      string
		repo      string
		pr        PullRequest
		want      PR
		wantErr   error
		wantCalls []string
	}{
		{
			name: "already open for the head: 422, then found and returned",
			repo: "acme/app", pr: PullRequest{Head: "agent/run_1", Base: "main", Title: "Again"},
			want:      first,
			wantCalls: []string{"POST /repos/acme/app/pulls", "GET /repos/acme/app/pulls"},
		},
		{
			name: "another head opens another",
			repo: "acme/app", pr: PullRequest{Head: "agent/run_2", Base: "main", Title: "Other"},
			want:      PR{Number: 2, HTMLURL: "https://github.com/acme/app/pull/2"},
			wantCalls: []string{"POST /repos/acme/app/pulls"},
		},
		{
			name: "head in a fork is passed as it is",
			repo: "acme/app", pr: PullRequest{Head: "octo:feature", Base: "main", Title: "From a fork"},
			want:      PR{Number: 3, HTMLURL: "https://github.com/acme/app/pull/3"},
			wantCalls: []string{"POST /repos/acme/app/pulls"},
		},
		{
			name: "no commits between: refused with GitHub's reason",
			repo: "acme/app", pr: PullRequest{Head: "main", Base: "main", Title: "Nothing"},
			wantErr:   ErrInvalid,
			wantCalls: []string{"POST /repos/acme/app/pulls"},
		},
		{
			name: "missing repository",
			repo: "acme/nope", pr: PullRequest{Head: "x", Base: "main", Title: "T"},
			wantErr:   ErrNotFound,
			wantCalls: []string{"POST /repos/acme/nope/pulls"},
		},
		{
			name: "not owner/name makes no call",
			repo: "acme", pr: PullRequest{Head: "x", Base: "main", Title: "T"},
			wantErr: ErrInvalid,
		},
		{
			name: "no title makes no call",
			repo: "acme/app", pr: PullRequest{Head: "x", Base: "main"},
			wantErr: ErrInvalid,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := g.OpenPullRequest(ctx, tt.repo, tt.pr)
			if calls := f.takeRequests(); !slices.Equal(calls, tt.wantCalls) {
				t.Errorf("calls = %q, want %q", calls, tt.wantCalls)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("open: %v", err)
			}
			if got != tt.want {
				t.Errorf("pr = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestNoCommitsErrorSaysWhy(t *testing.T) {
	f := newFakeGitHub(t, testToken, "octo", "acme")
	f.repos["acme/app"] = fakeRepo{Name: "app", FullName: "acme/app"}
	g := newTestGitHub(t, f, "acme", testToken)
	_, err := g.OpenPullRequest(context.Background(), "acme/app", PullRequest{Head: "main", Base: "main", Title: "T"})
	if err == nil || !strings.Contains(err.Error(), "No commits between main and main") || !strings.Contains(err.Error(), "acme/app") {
		t.Errorf("err = %v; want GitHub's reason and the repository", err)
	}
}

func TestAuthorizationCarriesToken(t *testing.T) {
	f := newFakeGitHub(t, testToken, "octo", "acme")
	g := newTestGitHub(t, f, "acme", testToken)
	if _, err := g.EnsureRepo(context.Background(), "r", "", true); err != nil {
		t.Fatalf("with the right token: %v", err)
	}
	bad := newTestGitHub(t, f, "acme", testToken+"x")
	_, err := bad.EnsureRepo(context.Background(), "r", "", true)
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("with a wrong token: err = %v, want ErrUnauthorized", err)
	}
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("error reveals the token: %v", err)
	}
	if !strings.Contains(err.Error(), "Bad credentials") {
		t.Errorf("error lacks GitHub's message: %v", err)
	}
}

func TestNewGitHubValidates(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		ok   bool
	}{
		{"defaults", Options{Token: "t", Owner: "acme"}, true},
		{"enterprise", Options{Token: "t", Owner: "acme", BaseURL: "https://ghe.example.com/api/v3", WebHost: "ghe.example.com"}, true},
		{"http to loopback", Options{Token: "t", Owner: "acme", BaseURL: "http://127.0.0.1:1/"}, true},
		{"no token", Options{Owner: "acme"}, false},
		{"no owner", Options{Token: "t"}, false},
		{"owner with a slash", Options{Token: "t", Owner: "acme/x"}, false},
		{"http elsewhere", Options{Token: "t", Owner: "acme", BaseURL: "http://api.example.com/"}, false},
		{"not a URL", Options{Token: "t", Owner: "acme", BaseURL: "::"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewGitHub(tt.opts)
			if (err == nil) != tt.ok {
				t.Errorf("err = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestParseRepoURL(t *testing.T) {
	g, err := NewGitHub(Options{Token: "t", Owner: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		url  string
		want string
		ok   bool
	}{
		{"https://github.com/acme/app", "acme/app", true},
		{"https://github.com/acme/app.git", "acme/app", true},
		{"https://github.com/acme/app/", "acme/app", true},
		{"https://GitHub.com/Acme/App.git", "Acme/App", true},
		{"https://github.com/acme/my.repo_1-x", "acme/my.repo_1-x", true},
		{"  https://github.com/acme/app  ", "acme/app", true},
		{"http://github.com/acme/app", "", false},
		{"https://github.com/acme", "", false},
		{"https://github.com/acme/app/tree/main", "", false},
		{"https://gitlab.com/acme/app", "", false},
		{"https://github.com.evil.example/acme/app", "", false},
		{"https://user:pw@github.com/acme/app", "", false},
		{"https://github.com/acme/app?x=1", "", false},
		{"git@github.com:acme/app.git", "", false},
		{"http://sandboxd.internal/git/1b4e28ba-2fa1-11d2-883f-0016d3cca427.git", "", false},
		{"https://github.com/-acme/app", "", false},
		{"https://github.com/acme/..", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, ok := g.ParseRepoURL(tt.url)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseRepoURL(%q) = %q, %v; want %q, %v", tt.url, got, ok, tt.want, tt.ok)
		}
	}

	ghe, err := NewGitHub(Options{Token: "t", Owner: "acme", BaseURL: "https://ghe.example.com/api/v3/", WebHost: "ghe.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := ghe.ParseRepoURL("https://ghe.example.com/acme/app.git"); !ok || got != "acme/app" {
		t.Errorf("enterprise host: %q, %v", got, ok)
	}
	if _, ok := ghe.ParseRepoURL("https://github.com/acme/app"); ok {
		t.Error("enterprise forge claims github.com")
	}
}

func TestRedact(t *testing.T) {
	tests := []struct{ in, token, want string }{
		{"fatal: token abc123 bad", "abc123", "fatal: token [REDACTED] bad"},
		{"push to https://x-access-token:abc@github.com/a/b.git failed", "", "push to https://[REDACTED]@github.com/a/b.git failed"},
		{"'https://u:p@h/x' and http://h2/y", "", "'https://[REDACTED]@h/x' and http://h2/y"},
		{"https://github.com/a/b", "", "https://github.com/a/b"},
		{"no urls here", "", "no urls here"},
		{"https://a:b@c", "", "https://[REDACTED]@c"},
	}
	for _, tt := range tests {
		if got := redact(tt.in, tt.token); got != tt.want {
			t.Errorf("redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
