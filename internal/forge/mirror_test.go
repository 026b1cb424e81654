package forge

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

const testAccount = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"

// mirrorFixture is a fake GitHub whose repositories live on a git server,
// an account's bare repository, and a Mirror between them.
type mirrorFixture struct {
	gh     *fakeGitHub
	srv    *gitServer
	src    string
	mirror *Mirror
	full   string // the mirror's owner/name
}

func newMirrorFixture(t testing.TB) *mirrorFixture {
	t.Helper()
	srv := newGitServer(t, testToken)
	gh := newFakeGitHub(t, testToken, "octo", "acme")
	gh.git = srv
	fx := &mirrorFixture{
		gh: gh, srv: srv,
		src:  newBare(t, filepath.Join(t.TempDir(), testAccount+".git")),
		full: "acme/sandbox-" + testAccount,
	}
	fx.mirror = fx.newMirror(t)
	return fx
}

// newMirror is a Mirror as a freshly started server has it.
func (fx *mirrorFixture) newMirror(t testing.TB) *Mirror {
	t.Helper()
	g, err := NewGitHub(Options{Token: testToken, Owner: "acme", BaseURL: fx.gh.URL})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMirror(MirrorOptions{Forge: g, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (fx *mirrorFixture) sync(t testing.TB) (Repo, error) {
	t.Helper()
	return fx.mirror.Sync(context.Background(), testAccount, fx.src)
}

// remote is the commit branch has on the forge.
func (fx *mirrorFixture) remote(t testing.TB, branch string) string {
	t.Helper()
	return revParse(t, fx.srv.repoPath(fx.full), "refs/heads/"+branch)
}

func (fx *mirrorFixture) local(t testing.TB, branch string) string {
	t.Helper()
	return revParse(t, fx.src, "refs/heads/"+branch)
}

func TestMirrorSync(t *testing.T) {
	fx := newMirrorFixture(t)
	c1 := commitOn(t, fx.src, "main", "first")

	// First sync creates the private mirror and pushes main.
	r, err := fx.sync(t)
	if err != nil {
		t.Fatalf("first sync: %v", err)
	}
	if r.FullName != fx.full || r.HTMLURL != "https://github.com/"+fx.full || r.CloneURL != fx.srv.URL+"/"+fx.full+".git" {
		t.Errorf("repo = %+v", r)
	}
	if !fx.gh.repos[fx.full].Private {
		t.Error("mirror created public")
	}
	if got := fx.remote(t, "main"); got != c1 {
		t.Errorf("forge main = %q, want %q", got, c1)
	}
	assertNoSecret(t, fx.src, testToken)

	// Nothing changed: no API call, no git traffic.
	fx.gh.takeRequests()
	before := fx.srv.requestCount()
	if _, err := fx.sync(t); err != nil {
		t.Fatalf("idle sync: %v", err)
	}
	if calls := fx.gh.takeRequests(); len(calls) != 0 {
		t.Errorf("idle sync called the API: %q", calls)
	}
	if n := fx.srv.requestCount() - before; n != 0 {
		t.Errorf("idle sync made %d git requests", n)
	}

	// New work and a new branch land.
	c2 := commitOn(t, fx.src, "main", "second")
	f1 := commitOn(t, fx.src, "sandbox/sb_1", "sandbox work", c1)
	if _, err := fx.sync(t); err != nil {
		t.Fatalf("sync of new work: %v", err)
	}
	if fx.remote(t, "main") != c2 || fx.remote(t, "sandbox/sb_1") != f1 {
		t.Errorf("forge main, sandbox/sb_1 = %q, %q; want %q, %q", fx.remote(t, "main"), fx.remote(t, "sandbox/sb_1"), c2, f1)
	}

	// A branch rewritten here replaces what this mirror pushed before.
	f2 := commitOn(t, fx.src, "sandbox/sb_1", "sandbox work, amended", c1)
	if _, err := fx.sync(t); err != nil {
		t.Fatalf("sync of a rewritten branch: %v", err)
	}
	if got := fx.remote(t, "sandbox/sb_1"); got != f2 {
		t.Errorf("forge sandbox/sb_1 = %q, want the rewrite %q", got, f2)
	}

	// A branch pushed to the forge directly (a pull request's) stays.
	agent := commitOn(t, fx.srv.repoPath(fx.full), "agent/run_1", "agent change", c2)
	// A branch deleted here stays on the forge too.
	git(t, fx.src, "update-ref", "-d", "refs/heads/sandbox/sb_1")
	c3 := commitOn(t, fx.src, "main", "third")
	if _, err := fx.sync(t); err != nil {
		t.Fatalf("sync after deleting a branch: %v", err)
	}
	if fx.remote(t, "agent/run_1") != agent || fx.remote(t, "sandbox/sb_1") != f2 || fx.remote(t, "main") != c3 {
		t.Errorf("forge branches after sync: agent/run_1 %q, sandbox/sb_1 %q, main %q",
			fx.remote(t, "agent/run_1"), fx.remote(t, "sandbox/sb_1"), fx.remote(t, "main"))
	}
	if tracked := revParse(t, fx.src, "refs/forge/"+fx.full+"/heads/sandbox/sb_1"); tracked != "" {
		t.Errorf("tracking ref of a deleted branch kept: %s", tracked)
	}
	assertNoSecret(t, fx.src, testToken)
}

// TestMirrorKeepsForgeOnlyCommits: a pull request merged on the forge moves
// its main past ours; the mirror must not throw that away.
func TestMirrorKeepsForgeOnlyCommits(t *testing.T) {
	fx := newMirrorFixture(t)
	c1 := commitOn(t, fx.src, "main", "first")
	if _, err := fx.sync(t); err != nil {
		t.Fatal(err)
	}
	merged := commitOn(t, fx.srv.repoPath(fx.full), "main", "merged on the forge")
	commitOn(t, fx.src, "main", "more work here")
	other := commitOn(t, fx.src, "feature", "unrelated", c1)

	_, err := fx.sync(t)
	var un *UnmirroredError
	if !errors.As(err, &un) {
		t.Fatalf("err = %v, want *UnmirroredError", err)
	}
	if len(un.Branches) != 1 || un.Branches["main"] != reasonDiverged {
		t.Errorf("unmirrored = %v, want main only", un.Branches)
	}
	if !strings.Contains(err.Error(), "main (the forge has commits sandboxd lacks)") {
		t.Errorf("error text: %v", err)
	}
	if got := fx.remote(t, "main"); got != merged {
		t.Errorf("forge main = %q, want the merge %q kept", got, merged)
	}
	if got := fx.remote(t, "feature"); got != other {
		t.Errorf("other branches not mirrored: feature = %q, want %q", got, other)
	}

	// Once the forge's commit is in ours (fetched and merged, say), the
	// fast-forward goes through.
	fetchObjects(t, fx)
	c3 := commitOn(t, fx.src, "main", "merge of forge's main", fx.local(t, "main"), merged)
	if _, err := fx.sync(t); err != nil {
		t.Fatalf("sync after merging: %v", err)
	}
	if got := fx.remote(t, "main"); got != c3 {
		t.Errorf("forge main = %q, want %q", got, c3)
	}
}

// fetchObjects brings the forge's objects into the local repository, as a
// fetch would, without moving branches.
func fetchObjects(t testing.TB, fx *mirrorFixture) {
	t.Helper()
	git(t, fx.src, "fetch", "-q", fx.srv.repoPath(fx.full), "+refs/heads/*:refs/fetched/*")
}

func TestMirrorAfterRestart(t *testing.T) {
	fx := newMirrorFixture(t)
	c1 := commitOn(t, fx.src, "main", "first")
	if _, err := fx.sync(t); err != nil {
		t.Fatal(err)
	}
	// A new process: the mirror exists (found, not created again), and what
	// was pushed before is still known, so a rewrite goes through.
	fx.mirror = fx.newMirror(t)
	fx.gh.takeRequests()
	c1b := commitOn(t, fx.src, "main", "first, rewritten", "")
	if c1b == c1 {
		t.Fatal("rewrite made the same commit")
	}
	if _, err := fx.sync(t); err != nil {
		t.Fatalf("sync after restart: %v", err)
	}
	calls := fx.gh.takeRequests()
	for _, c := range calls {
		if strings.HasPrefix(c, "POST") {
			t.Errorf("restart created the mirror again: %q", calls)
		}
	}
	if got := fx.remote(t, "main"); got != c1b {
		t.Errorf("forge main = %q, want %q", got, c1b)
	}
}

func TestMirrorRecreatesDeletedMirror(t *testing.T) {
	fx := newMirrorFixture(t)
	commitOn(t, fx.src, "main", "first")
	if _, err := fx.sync(t); err != nil {
		t.Fatal(err)
	}
	fx.gh.deleteRepo(fx.full)
	commitOn(t, fx.src, "main", "second")
	_, err := fx.sync(t)
	if err == nil {
		t.Fatal("sync to a deleted mirror succeeded")
	}
	t.Logf("sync to a deleted mirror: %v", err)
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("error reveals the token: %v", err)
	}
	// The next sync looks the mirror up again, creates it and pushes all.
	if _, err := fx.sync(t); err != nil {
		t.Fatalf("sync after the mirror was deleted: %v", err)
	}
	if got, want := fx.remote(t, "main"), fx.local(t, "main"); got != want {
		t.Errorf("forge main = %q, want %q", got, want)
	}
}

func TestMirrorEmptyRepository(t *testing.T) {
	fx := newMirrorFixture(t)
	r, err := fx.sync(t)
	if err != nil {
		t.Fatalf("sync of an empty repository: %v", err)
	}
	if r.FullName != fx.full {
		t.Errorf("repo = %+v", r)
	}
	if _, ok := fx.gh.repos[fx.full]; !ok {
		t.Error("mirror not created")
	}
}

func TestMirrorPublicOption(t *testing.T) {
	fx := newMirrorFixture(t)
	g, err := NewGitHub(Options{Token: testToken, Owner: "acme", BaseURL: fx.gh.URL})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMirror(MirrorOptions{Forge: g, Token: testToken, Public: true, NamePrefix: "ws-"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Sync(context.Background(), testAccount, fx.src)
	if err != nil {
		t.Fatal(err)
	}
	if r.FullName != "acme/ws-"+testAccount || fx.gh.repos[r.FullName].Private {
		t.Errorf("repo %+v private=%v; want public acme/ws-<id>", r, fx.gh.repos[r.FullName].Private)
	}
}

// loopbackForge is the fake GitHub with the test git server as its web
// host: SyncURL needs a forge whose repository URLs git can reach here.
type loopbackForge struct {
	*GitHub
	srv *gitServer
}

func (f loopbackForge) ParseRepoURL(u string) (string, bool) {
	rest, ok := strings.CutPrefix(u, f.srv.URL+"/")
	if !ok {
		return "", false
	}
	owner, name, ok := strings.Cut(strings.TrimSuffix(rest, ".git"), "/")
	if !ok || !validOwner(owner) || !validRepoName(name) {
		return "", false
	}
	return owner + "/" + name, true
}

func TestMirrorSyncURL(t *testing.T) {
	fx := newMirrorFixture(t)
	g, err := NewGitHub(Options{Token: testToken, Owner: "acme", BaseURL: fx.gh.URL})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMirror(MirrorOptions{Forge: loopbackForge{g, fx.srv}, Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ext := newBare(t, fx.srv.repoPath("octo/own-repo"))
	c1 := commitOn(t, fx.src, "main", "first")

	r, err := m.SyncURL(ctx, fx.src, fx.srv.URL+"/octo/own-repo")
	if err != nil {
		t.Fatalf("SyncURL: %v", err)
	}
	if r.FullName != "octo/own-repo" || r.CloneURL != fx.srv.URL+"/octo/own-repo.git" {
		t.Errorf("repo = %+v", r)
	}
	if got := revParse(t, ext, "refs/heads/main"); got != c1 {
		t.Errorf("external main = %q, want %q", got, c1)
	}
	// The account's mirror is tracked apart from its external remote.
	if _, err := m.Sync(ctx, testAccount, fx.src); err != nil {
		t.Fatalf("Sync beside SyncURL: %v", err)
	}
	if got := fx.remote(t, "main"); got != c1 {
		t.Errorf("mirror main = %q, want %q", got, c1)
	}
	// An existing repository with its own history is not overwritten.
	other := newBare(t, fx.srv.repoPath("octo/busy"))
	theirs := commitOn(t, other, "main", "their history")
	_, err = m.SyncURL(ctx, fx.src, fx.srv.URL+"/octo/busy.git")
	var un *UnmirroredError
	if !errors.As(err, &un) || un.Branches["main"] != reasonDiverged {
		t.Errorf("SyncURL to a repository with other history: err = %v", err)
	}
	if got := revParse(t, other, "refs/heads/main"); got != theirs {
		t.Errorf("their main = %q, want %q kept", got, theirs)
	}

	// The token goes to the forge only.
	for _, u := range []string{"https://example.com/octo/own-repo.git", "http://127.0.0.1:1/octo/own-repo.git"} {
		if _, err := m.SyncURL(ctx, fx.src, u); !errors.Is(err, ErrNotOnForge) {
			t.Errorf("SyncURL(%s): err = %v, want ErrNotOnForge", u, err)
		}
	}
}

func TestMirrorConcurrentSyncs(t *testing.T) {
	fx := newMirrorFixture(t)
	commitOn(t, fx.src, "main", "first")
	for i := range 3 {
		commitOn(t, fx.src, "branch-"+string(rune('a'+i)), "work "+string(rune('a'+i)))
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := fx.mirror.Sync(context.Background(), testAccount, fx.src)
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent sync: %v", err)
		}
	}
	creates := 0
	for _, c := range fx.gh.takeRequests() {
		if strings.HasPrefix(c, "POST") {
			creates++
		}
	}
	if creates != 1 {
		t.Errorf("mirror created %d times", creates)
	}
	for _, b := range []string{"main", "branch-a", "branch-b", "branch-c"} {
		if got, want := fx.remote(t, b), fx.local(t, b); got != want {
			t.Errorf("forge %s = %q, want %q", b, got, want)
		}
	}
}

// BenchmarkMirrorIdleSync is the cost of Sync after a run that changed
// nothing: what every run pays when mirroring is on.
func BenchmarkMirrorIdleSync(b *testing.B) {
	fx := newMirrorFixture(b)
	for i := range 20 {
		commitOn(b, fx.src, fmt.Sprintf("branch-%d", i), fmt.Sprintf("work %d", i))
	}
	ctx := context.Background()
	if _, err := fx.mirror.Sync(ctx, testAccount, fx.src); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := fx.mirror.Sync(ctx, testAccount, fx.src); err != nil {
			b.Fatal(err)
		}
	}
}
