package forge

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPush(t *testing.T) {
	ctx := context.Background()
	srv := newGitServer(t, testToken)
	remote := newBare(t, srv.repoPath("acme/app"))
	src := newBare(t, filepath.Join(t.TempDir(), "src.git"))
	c1 := commitOn(t, src, "main", "first")
	commitOn(t, src, "feature", "feature work", c1)

	url := srv.URL + "/acme/app.git"
	if err := Push(ctx, "git", src, url, testToken, "refs/heads/main:refs/heads/main", "refs/heads/feature:refs/heads/feature"); err != nil {
		t.Fatalf("Push: %v", err)
	}
	for _, b := range []string{"main", "feature"} {
		if got, want := revParse(t, remote, "refs/heads/"+b), revParse(t, src, "refs/heads/"+b); got != want {
			t.Errorf("remote %s = %q, want %q", b, got, want)
		}
	}
	srv.mu.Lock()
	users := srv.users
	srv.mu.Unlock()
	if !users["x-access-token"] || len(users) != 1 {
		t.Errorf("authenticated users = %v, want only x-access-token", users)
	}

	// A fast-forward lands; the token is nowhere on disk, on either side.
	commitOn(t, src, "main", "second")
	if err := Push(ctx, "git", src, url, testToken, "refs/heads/main:refs/heads/main"); err != nil {
		t.Fatalf("Push fast-forward: %v", err)
	}
	if got, want := revParse(t, remote, "refs/heads/main"), revParse(t, src, "refs/heads/main"); got != want {
		t.Errorf("remote main = %q, want %q", got, want)
	}
	assertNoSecret(t, src, testToken)
	assertNoSecret(t, srv.root, testToken)
	if cfg, err := os.ReadFile(filepath.Join(src, "config")); err != nil || strings.Contains(string(cfg), "credential") || strings.Contains(string(cfg), "remote") {
		t.Errorf("push changed the repository's config (%v):\n%s", err, cfg)
	}

	// A rewritten branch is not forced without '+', and the error names it.
	git(t, src, "update-ref", "refs/heads/main", commitOn(t, src, "other", "rewritten", c1))
	err := Push(ctx, "git", src, url, testToken, "refs/heads/main:refs/heads/main")
	if err == nil || !strings.Contains(err.Error(), "rejected refs/heads/main") {
		t.Errorf("non-fast-forward push: err = %v, want a rejection of refs/heads/main", err)
	}
	if err := Push(ctx, "git", src, url, testToken, "+refs/heads/main:refs/heads/main"); err != nil {
		t.Errorf("forced push: %v", err)
	}
	if got, want := revParse(t, remote, "refs/heads/main"), revParse(t, src, "refs/heads/main"); got != want {
		t.Errorf("after forced push remote main = %q, want %q", got, want)
	}
}

func TestPushWrongTokenFailsWithoutRevealingIt(t *testing.T) {
	srv := newGitServer(t, testToken)
	newBare(t, srv.repoPath("acme/app"))
	src := newBare(t, filepath.Join(t.TempDir(), "src.git"))
	commitOn(t, src, "main", "first")
	const wrong = "ghp_wrong_secret_0123456789"
	err := Push(context.Background(), "git", src, srv.URL+"/acme/app.git", wrong, "refs/heads/main:refs/heads/main")
	if err == nil {
		t.Fatal("push with a wrong token succeeded")
	}
	if strings.Contains(err.Error(), wrong) {
		t.Errorf("error reveals the token: %v", err)
	}
	if !strings.Contains(err.Error(), "Authentication failed") {
		t.Errorf("error does not say why: %v", err)
	}
	if srv.denied == 0 {
		t.Error("the server never saw a rejected attempt")
	}
	assertNoSecret(t, src, wrong)
}

// TestPushTokenNotInArguments runs Push through a git wrapper that records
// its arguments: the token must not be among them.
func TestPushTokenNotInArguments(t *testing.T) {
	srv := newGitServer(t, testToken)
	newBare(t, srv.repoPath("acme/app"))
	src := newBare(t, filepath.Join(t.TempDir(), "src.git"))
	commitOn(t, src, "main", "first")
	dir := t.TempDir()
	log := filepath.Join(dir, "args.log")
	wrapper := filepath.Join(dir, "git")
	script := "#!/bin/sh\nprintf '%s\\n' \"$*\" >> " + log + "\nexec git \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Push(context.Background(), wrapper, src, srv.URL+"/acme/app.git", testToken, "refs/heads/main:refs/heads/main"); err != nil {
		t.Fatalf("Push through wrapper: %v", err)
	}
	args, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(args), "push") {
		t.Fatalf("wrapper did not run: %q", args)
	}
	if strings.Contains(string(args), testToken) {
		t.Errorf("token in git's arguments: %q", args)
	}
}

func TestPushRefusesUnsafeRemotes(t *testing.T) {
	src := newBare(t, filepath.Join(t.TempDir(), "src.git"))
	commitOn(t, src, "main", "first")
	tests := []struct{ name, url, want string }{
		{"credentials in URL", "https://x-access-token:" + testToken + "@github.com/acme/app.git", "must not carry credentials"},
		{"plain http elsewhere", "http://github.com/acme/app.git", "must use https"},
		{"ssh", "ssh://git@github.com/acme/app.git", "must use https"},
		{"file", "file:///tmp/x.git", "must use https"},
		{"no host", "https:///acme/app.git", "no host"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Push(context.Background(), "git", src, tt.url, testToken, "refs/heads/main:refs/heads/main")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if strings.Contains(err.Error(), testToken) {
				t.Errorf("error reveals the token: %v", err)
			}
		})
	}
	if err := Push(context.Background(), "git", src, "https://github.com/a/b.git", testToken); err == nil {
		t.Error("push without refspecs succeeded")
	}
	if err := Push(context.Background(), "git", src, "https://github.com/a/b.git", testToken, "--delete"); err == nil {
		t.Error("option-like refspec accepted")
	}
}

func TestParsePorcelain(t *testing.T) {
	out := "To http://127.0.0.1:1/a/b.git\n" +
		" \trefs/heads/main:refs/heads/main\t1111111..2222222\n" +
		"*\trefs/heads/new:refs/heads/new\t[new branch]\n" +
		"!\trefs/heads/old:refs/heads/old\t[rejected] (stale info)\n" +
		"=\trefs/heads/same:refs/heads/same\t[up to date]\n" +
		"Done\n"
	got := parsePorcelain([]byte(out))
	want := []refUpdate{
		{' ', "refs/heads/main", "refs/heads/main", "1111111..2222222"},
		{'*', "refs/heads/new", "refs/heads/new", "[new branch]"},
		{'!', "refs/heads/old", "refs/heads/old", "[rejected] (stale info)"},
		{'=', "refs/heads/same", "refs/heads/same", "[up to date]"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d updates, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("update %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
