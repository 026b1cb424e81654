package repo

import (
	"context"
	"errors"
	"testing"
)

// allowAll lets every account use every repository through submodules.
var allowAll = AccessFunc(func(context.Context, string, string, Use) (bool, error) { return true, nil })

func TestOwnerOf(t *testing.T) {
	m := newManager(t, Options{LocalURLs: []string{"http://127.0.0.1:8080", "http://sandboxd.internal", "https://example.com/sandboxd/"}})
	base, other := newAccount(), newAccount()
	cases := []struct {
		url  string
		want string // "" for not hosted here
	}{
		{"../" + other + ".git", other},
		{"../" + other, other},
		{"./../" + other + ".git", other},
		{"../../git/" + other + ".git", other},
		{"http://127.0.0.1:8080/git/" + other + ".git", other},
		{"http://user:secret@127.0.0.1:8080/git/" + other + ".git", other},
		{"http://sandboxd.internal/git/" + other + ".git", other},
		{"http://SANDBOXD.internal:80/git/" + other + ".git", other},
		{"https://example.com/sandboxd/git/" + other + ".git", other},
		{"http://example.com:443/sandboxd/git/" + other + ".git", other}, // same host and port, whatever the scheme
		{"https://example.com/git/" + other + ".git", ""},                // outside the prefix
		{"http://127.0.0.1:8081/git/" + other + ".git", ""},
		{"https://github.com/org/repo.git", ""},
		{"git@github.com:org/repo.git", ""},
		{"/srv/repos/" + other + ".git", ""},
		{"../../../" + other + ".git", ""},
		{"../not-a-uuid.git", ""},
		{"../" + other + ".git/extra", ""},
		{"./sub", ""},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			got, err := m.ownerOf(base, tc.url)
			if tc.want == "" {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("ownerOf = %q, %v; want not hosted here", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ownerOf = %q, %v; want %s", got, err, tc.want)
			}
		})
	}
}

// submoduleFixture builds three repositories: a's mods/b is b's repository
// (relative URL), and b's vendor/c is c's (absolute URL of this server).
type submoduleFixture struct {
	m                  *Manager
	a, b, c            string
	bCommit, cCommit   string
	bCommitWithGitlink string
}

func newSubmoduleFixture(t *testing.T, access SubmoduleAccess) submoduleFixture {
	t.Helper()
	f := submoduleFixture{a: newAccount(), b: newAccount(), c: newAccount()}
	f.m = newManager(t, Options{LocalURLs: []string{"http://sandboxd.internal"}, Access: access})
	f.cCommit = commitOne(t, f.m, f.c, map[string]string{"deep.txt": "from c"})
	f.bCommit = commitOne(t, f.m, f.b, map[string]string{"lib/x.txt": "from b", "vendor/README": "vendored"})
	setGitlinks(t, f.m, f.b, map[string][2]string{"vendor/c": {"http://sandboxd.internal/git/" + f.c + ".git", f.cCommit}})
	f.bCommitWithGitlink, _ = f.m.Head(context.Background(), f.b, MainBranch)
	commitOne(t, f.m, f.a, map[string]string{"top.txt": "from a", "mods/readme": "mods dir"})
	setGitlinks(t, f.m, f.a, map[string][2]string{
		"mods/b": {"../" + f.b + ".git", f.bCommitWithGitlink},
		// Listed, but a directory in the tree: not a submodule.
		"mods": {"../" + f.c + ".git", ""},
	})
	return f
}

func TestReadThroughSubmodules(t *testing.T) {
	ctx := context.Background()
	f := newSubmoduleFixture(t, allowAll)

	// b moves on after a recorded it: a still reads the recorded commit.
	commitOne(t, f.m, f.b, map[string]string{"lib/x.txt": "newer b"})

	cases := []struct {
		path string
		want string // "" for not found
	}{
		{"top.txt", "from a"},
		{"mods/readme", "mods dir"},
		{"mods/b/lib/x.txt", "from b"},
		{"mods/b/vendor/README", "vendored"},
		{"mods/b/vendor/c/deep.txt", "from c"},
		{"mods/b", ""},
		{"mods/b/lib", ""},
		{"mods/b/vendor/c", ""},
		{"mods/b/missing.txt", ""},
		{"mods/b/vendor/c/missing.txt", ""},
	}
	for _, tc := range cases {
		t.Run(tc.path, func(t *testing.T) {
			got, err := f.m.ReadFile(ctx, f.a, tc.path)
			if tc.want == "" {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("ReadFile = %q, %v; want not found", got, err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("ReadFile = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestSubmoduleAccess(t *testing.T) {
	ctx := context.Background()
	var asked [][2]string
	onlyB := AccessFunc(func(_ context.Context, account, owner string, _ Use) (bool, error) {
		asked = append(asked, [2]string{account, owner})
		return false, nil
	})
	f := newSubmoduleFixture(t, onlyB)
	if _, err := f.m.ReadFile(ctx, f.a, "mods/b/lib/x.txt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read through a denied submodule: %v", err)
	}
	if len(asked) != 1 || asked[0] != [2]string{f.a, f.b} {
		t.Fatalf("access asked %v", asked)
	}
	if _, _, err := f.m.CommitFiles(ctx, f.a, MainBranch, []File{BytesFile("mods/b/new.txt", []byte("x"))}, "x", Signature{}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("write through a denied submodule: %v", err)
	}

	// Without an access rule, only the account's own repository counts.
	m := newManager(t, Options{Root: f.m.Root()})
	if _, err := m.ReadFile(ctx, f.a, "mods/b/lib/x.txt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read with no access rule: %v", err)
	}
	// Nested reads ask for the reading account, not the intermediate one.
	asked = nil
	viaB := AccessFunc(func(_ context.Context, account, owner string, _ Use) (bool, error) {
		asked = append(asked, [2]string{account, owner})
		return owner == f.b, nil
	})
	m = newManager(t, Options{Root: f.m.Root(), LocalURLs: []string{"http://sandboxd.internal"}, Access: viaB})
	if _, err := m.ReadFile(ctx, f.a, "mods/b/vendor/c/deep.txt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("nested read past a denied repository: %v", err)
	}
	if len(asked) != 2 || asked[1] != [2]string{f.a, f.c} {
		t.Fatalf("access asked %v", asked)
	}
}

func TestCommitIntoSubmodules(t *testing.T) {
	ctx := context.Background()
	f := newSubmoduleFixture(t, allowAll)
	// b's main moved past the commit a records: the new file is committed
	// on b's main, keeping that work.
	commitOne(t, f.m, f.b, map[string]string{"later.txt": "later"})
	bHead, _ := f.m.Head(ctx, f.b, MainBranch)
	aHead, _ := f.m.Head(ctx, f.a, MainBranch)
	cHead, _ := f.m.Head(ctx, f.c, MainBranch)

	commit, blobs, err := f.m.CommitFiles(ctx, f.a, MainBranch, []File{
		BytesFile("mods/b/lib/new.txt", []byte("into b")),
		BytesFile("mods/b/vendor/c/n.txt", []byte("into c")),
		BytesFile("top2.txt", []byte("into a")),
	}, "upload into submodules", Signature{})
	if err != nil {
		t.Fatal(err)
	}
	if len(blobs) != 3 || blobs["mods/b/lib/new.txt"] == "" || blobs["mods/b/vendor/c/n.txt"] == "" {
		t.Fatalf("blobs %v", blobs)
	}
	pa, _ := f.m.Path(f.a)
	pb, _ := f.m.Path(f.b)
	pc, _ := f.m.Path(f.c)
	// One commit in each repository, each on its previous head.
	for _, r := range []struct{ path, before string }{{pa, aHead}, {pb, bHead}, {pc, cHead}} {
		if parent := gitCmd(t, r.path, "rev-parse", "main^"); parent != r.before {
			t.Fatalf("%s: parent %s, want %s", r.path, parent, r.before)
		}
		if out, err := gitTry(r.path, "fsck", "--strict", "--no-dangling"); err != nil {
			t.Fatalf("fsck %s: %v\n%s", r.path, err, out)
		}
	}
	if commit != gitCmd(t, pa, "rev-parse", "main") {
		t.Fatal("returned commit is not a's main")
	}
	// The gitlinks name the new commits.
	if link := gitCmd(t, pa, "rev-parse", "main:mods/b"); link != gitCmd(t, pb, "rev-parse", "main") {
		t.Fatalf("a's gitlink %s is not b's main", link)
	}
	if link := gitCmd(t, pb, "rev-parse", "main:vendor/c"); link != gitCmd(t, pc, "rev-parse", "main") {
		t.Fatalf("b's gitlink %s is not c's main", link)
	}
	if blob := gitCmd(t, pc, "rev-parse", "main:n.txt"); blob != blobs["mods/b/vendor/c/n.txt"] {
		t.Fatalf("blob id %s, want %s", blob, blobs["mods/b/vendor/c/n.txt"])
	}
	for p, want := range map[string]string{
		"mods/b/lib/new.txt":       "into b",
		"mods/b/later.txt":         "later",
		"mods/b/vendor/c/n.txt":    "into c",
		"mods/b/vendor/c/deep.txt": "from c",
		"top2.txt":                 "into a",
	} {
		if got, err := f.m.ReadFile(ctx, f.a, p); err != nil || string(got) != want {
			t.Fatalf("%s = %q, %v; want %q", p, got, err, want)
		}
	}

	// The submodule itself cannot be overwritten by a file.
	if _, _, err := f.m.CommitFiles(ctx, f.a, MainBranch, []File{BytesFile("mods/b", []byte("x"))}, "x", Signature{}); !errors.Is(err, ErrInvalidPath) {
		t.Fatalf("overwrite a submodule: %v", err)
	}
}
