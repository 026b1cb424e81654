package repo

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

// gitServerFixture is a git server on loopback backed by a real store:
// alice and bob are personal accounts, acme an organization alice belongs
// to; each has a key.
type gitServerFixture struct {
	m                         *Manager
	srv                       *httptest.Server
	alice, bob, acme          store.Account
	aliceKey, bobKey, acmeKey string
	sandboxKey, revokedKey    string
	authn                     *auth.Authenticator
}

func newGitServer(t *testing.T) gitServerFixture {
	t.Helper()
	return newGitServerWith(t, Limits{})
}

// newGitServerWith is newGitServer with the given limits.
func newGitServerWith(t *testing.T, limits Limits) gitServerFixture {
	t.Helper()
	return newGitServerOpts(t, Options{Limits: limits})
}

// newGitServerOpts is newGitServer on a Manager with opts.
func newGitServerOpts(t *testing.T, opts Options) gitServerFixture {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	var f gitServerFixture
	mk := func(name string, kind store.AccountKind) store.Account {
		a := store.Account{Name: name, Kind: kind}
		if err := st.CreateAccount(ctx, &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	key := func(a store.Account, sandboxID string, revoke bool) string {
		plain, prefix, hash, err := auth.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		k := store.APIKey{AccountID: a.ID, Name: "test", Prefix: prefix, Hash: hash, SandboxID: sandboxID}
		if err := st.CreateAPIKey(ctx, &k); err != nil {
			t.Fatal(err)
		}
		if revoke {
			if err := st.RevokeAPIKey(ctx, k.ID, k.CreatedAt); err != nil {
				t.Fatal(err)
			}
		}
		return plain
	}
	f.alice, f.bob, f.acme = mk("alice", store.AccountPersonal), mk("bob", store.AccountPersonal), mk("acme", store.AccountOrg)
	if err := st.AddOrgMember(ctx, f.acme.ID, f.alice.ID); err != nil {
		t.Fatal(err)
	}
	sb := store.Sandbox{AccountID: f.alice.ID, NodeID: "node-1", Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
	if err := st.CreateSandbox(ctx, &sb); err != nil {
		t.Fatal(err)
	}
	f.aliceKey, f.bobKey, f.acmeKey = key(f.alice, "", false), key(f.bob, "", false), key(f.acme, "", false)
	f.sandboxKey, f.revokedKey = key(f.alice, sb.ID, false), key(f.alice, "", true)

	f.authn = auth.NewAuthenticator(st)
	f.m = newManager(t, opts)
	f.srv = serveGit(t, f.m, f.authn)
	return f
}

// serveGit serves m's repositories over git smart HTTP on loopback.
func serveGit(t *testing.T, m *Manager, authn *auth.Authenticator) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(GitPathPrefix, m.GitHTTPHandler(authn))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// url is the clone URL of account's repository with key as the password.
func (f gitServerFixture) url(account, key string) string {
	u, _ := url.Parse(f.srv.URL + GitPathPrefix + account + ".git")
	if key != "" {
		u.User = url.UserPassword("x", key)
	}
	return u.String()
}

func TestGitCloneAndPush(t *testing.T) {
	ctx := context.Background()
	f := newGitServer(t)

	// The first clone of an authorised caller creates an empty repository.
	wt := filepath.Join(t.TempDir(), "alice")
	gitCmd(t, "", "clone", "-q", f.url(f.alice.ID, f.aliceKey), wt)
	if ok, _ := f.m.Exists(ctx, f.alice.ID); !ok {
		t.Fatal("clone did not create the repository")
	}

	// Push a text file and a binary larger than git's 1 MiB post buffer,
	// which makes git send a chunked request body.
	big := make([]byte, 3<<20)
	_, _ = rand.Read(big)
	if err := os.WriteFile(filepath.Join(wt, "report.md"), []byte("# report\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(wt, "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	gitCmd(t, wt, "add", ".")
	gitCmd(t, wt, "commit", "-q", "-m", "from a clone")
	gitCmd(t, wt, "push", "-q", "origin", "HEAD:main")
	if got, err := f.m.ReadFile(ctx, f.alice.ID, "report.md"); err != nil || string(got) != "# report\n" {
		t.Fatalf("pushed report.md = %q, %v", got, err)
	}
	if got, err := f.m.ReadFile(ctx, f.alice.ID, "big.bin"); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("pushed big.bin: %d bytes, %v", len(got), err)
	}

	// A commit made on the server arrives in the clone.
	commitOne(t, f.m, f.alice.ID, map[string]string{"uploaded.txt": "server side"})
	gitCmd(t, wt, "pull", "-q", "--ff-only", "origin", "main")
	if got, _ := os.ReadFile(filepath.Join(wt, "uploaded.txt")); string(got) != "server side" {
		t.Fatalf("pulled uploaded.txt = %q", got)
	}

	// An organization key may act for its member; the canonical name is
	// served whatever case the caller used.
	wt2 := filepath.Join(t.TempDir(), "org")
	gitCmd(t, "", "clone", "-q", f.url(strings.ToUpper(f.alice.ID), f.acmeKey), wt2)
	if got, _ := os.ReadFile(filepath.Join(wt2, "report.md")); string(got) != "# report\n" {
		t.Fatalf("org clone report.md = %q", got)
	}
	// A sandbox's key works for its own account.
	gitCmd(t, "", "clone", "-q", f.url(f.alice.ID, f.sandboxKey), filepath.Join(t.TempDir(), "sbx"))
	// Bearer tokens work too (git -c http.extraHeader).
	gitCmd(t, "", "-c", "http.extraHeader=Authorization: Bearer "+f.aliceKey, "ls-remote", f.url(f.alice.ID, ""))
}

func TestGitCloneWithSubmodule(t *testing.T) {
	f := newGitServer(t)
	// acme's repository has alice's as a submodule by relative URL; acme's
	// key may act for alice, so a recursive clone with it fetches both.
	aliceCommit := commitOne(t, f.m, f.alice.ID, map[string]string{"notes.txt": "alice's notes"})
	commitOne(t, f.m, f.acme.ID, map[string]string{"README.md": "acme"})
	setGitlinks(t, f.m, f.acme.ID, map[string][2]string{"members/alice": {"../" + f.alice.ID + ".git", aliceCommit}})

	wt := filepath.Join(t.TempDir(), "acme")
	gitCmd(t, "", "clone", "-q", "--recurse-submodules", f.url(f.acme.ID, f.acmeKey), wt)
	if got, err := os.ReadFile(filepath.Join(wt, "members/alice/notes.txt")); err != nil || string(got) != "alice's notes" {
		t.Fatalf("submodule file = %q, %v", got, err)
	}
}

func TestGitAccess(t *testing.T) {
	f := newGitServer(t)
	infoRefs := func(account string) string {
		return f.srv.URL + GitPathPrefix + account + ".git/info/refs?service=git-upload-pack"
	}
	pushRefs := func(account string) string {
		return f.srv.URL + GitPathPrefix + account + ".git/info/refs?service=git-receive-pack"
	}
	cases := []struct {
		name      string
		method    string
		url       string
		user, key string
		bearer    string
		want      int
	}{
		{"no credentials", "GET", infoRefs(f.alice.ID), "", "", "", http.StatusUnauthorized},
		{"wrong key", "GET", infoRefs(f.alice.ID), "x", "sbx_wrong", "", http.StatusUnauthorized},
		{"revoked key", "GET", infoRefs(f.alice.ID), "x", f.revokedKey, "", http.StatusUnauthorized},
		{"wrong bearer", "GET", infoRefs(f.alice.ID), "", "", "sbx_wrong", http.StatusUnauthorized},
		{"own key", "GET", infoRefs(f.alice.ID), "x", f.aliceKey, "", http.StatusOK},
		{"key as user name", "GET", infoRefs(f.alice.ID), f.aliceKey, "", "", http.StatusOK},
		{"other account", "GET", infoRefs(f.alice.ID), "x", f.bobKey, "", http.StatusNotFound},
		// Members read their organization's repository (it is their
		// submodule) but do not push to it; strangers do neither.
		{"member fetches its org", "GET", infoRefs(f.acme.ID), "x", f.aliceKey, "", http.StatusOK},
		{"member's sandbox fetches the org", "GET", infoRefs(f.acme.ID), "x", f.sandboxKey, "", http.StatusOK},
		{"member pushes to its org", "GET", pushRefs(f.acme.ID), "x", f.aliceKey, "", http.StatusNotFound},
		{"member's sandbox pushes to the org", "GET", pushRefs(f.acme.ID), "x", f.sandboxKey, "", http.StatusNotFound},
		{"stranger fetches the org", "GET", infoRefs(f.acme.ID), "x", f.bobKey, "", http.StatusNotFound},
		{"own push", "GET", pushRefs(f.alice.ID), "x", f.aliceKey, "", http.StatusOK},
		{"not a uuid", "GET", f.srv.URL + GitPathPrefix + "etc.git/info/refs?service=git-upload-pack", "x", f.aliceKey, "", http.StatusNotFound},
		{"dumb protocol", "GET", f.srv.URL + GitPathPrefix + f.alice.ID + ".git/HEAD", "x", f.aliceKey, "", http.StatusNotFound},
		{"unknown service", "GET", f.srv.URL + GitPathPrefix + f.alice.ID + ".git/info/refs?service=git-upload-archive", "x", f.aliceKey, "", http.StatusNotFound},
		{"config file", "GET", f.srv.URL + GitPathPrefix + f.alice.ID + ".git/config", "x", f.aliceKey, "", http.StatusNotFound},
		{"receive-pack by GET", "GET", f.srv.URL + GitPathPrefix + f.alice.ID + ".git/git-receive-pack", "x", f.aliceKey, "", http.StatusNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, tc.url, nil)
			if tc.user != "" || tc.key != "" {
				req.SetBasicAuth(tc.user, tc.key)
			}
			if tc.bearer != "" {
				req.Header.Set("Authorization", "Bearer "+tc.bearer)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
			if tc.want == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") != `Basic realm="sandboxd"` {
				t.Fatalf("WWW-Authenticate = %q", resp.Header.Get("WWW-Authenticate"))
			}
		})
	}
	// Refused callers created nothing (acme's was created by its members'
	// allowed fetches).
	for _, a := range []string{f.bob.ID} {
		if ok, _ := f.m.Exists(context.Background(), a); ok {
			t.Fatalf("repository of %s created by a refused request", a)
		}
	}

	// The git client sees the same: a wrong key fails authentication, and
	// another account's repository does not exist.
	out, err := gitTry("", "ls-remote", f.url(f.alice.ID, "sbx_wrong"))
	if err == nil || !strings.Contains(out, "Authentication failed") {
		t.Fatalf("ls-remote with a wrong key: %v\n%s", err, out)
	}
	out, err = gitTry("", "ls-remote", f.url(f.alice.ID, f.bobKey))
	if err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("ls-remote of another account: %v\n%s", err, out)
	}
	// Pushing into another account's repository is refused too.
	commitOne(t, f.m, f.bob.ID, map[string]string{"bob.txt": "bob"})
	wt := t.TempDir()
	gitCmd(t, wt, "init", "-q")
	gitCmd(t, wt, "commit", "-q", "--allow-empty", "-m", "intruder")
	if out, err := gitTry(wt, "push", f.url(f.bob.ID, f.aliceKey), "HEAD:main"); err == nil {
		t.Fatalf("push into bob's repository with alice's key succeeded:\n%s", out)
	}
	if got, _ := f.m.ReadFile(context.Background(), f.bob.ID, "bob.txt"); string(got) != "bob" {
		t.Fatal("bob's repository changed")
	}
}
