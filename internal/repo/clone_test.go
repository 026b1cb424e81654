package repo

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// pushTree makes a commit of files (path → content; a "->" prefix makes a
// symbolic link, a "#!" one an executable) with the git client, tags it
// v1, and pushes main, a branch "feature" and the tag into account's
// repository.
func pushTree(t *testing.T, m *Manager, account string, files map[string]string) string {
	t.Helper()
	bare, err := m.Ensure(context.Background(), account)
	if err != nil {
		t.Fatal(err)
	}
	wt := t.TempDir()
	gitCmd(t, wt, "init", "-q", "-b", "main")
	for p, c := range files {
		full := filepath.Join(wt, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case len(c) > 2 && c[:2] == "->":
			err = os.Symlink(c[2:], full)
		case len(c) > 2 && c[:2] == "#!":
			err = os.WriteFile(full, []byte(c), 0o755)
		default:
			err = os.WriteFile(full, []byte(c), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	gitCmd(t, wt, "add", "-A")
	gitCmd(t, wt, "commit", "-q", "-m", "tree")
	gitCmd(t, wt, "tag", "-a", "-m", "one", "v1")
	gitCmd(t, wt, "push", "-q", bare, "main", "main:feature", "v1")
	return gitCmd(t, wt, "rev-parse", "HEAD")
}

// TestWriteCloneIsAClone: the archive unpacked is what `git clone` makes
// (main checked out, clean, tracking origin/main; every branch as
// origin's; the tags; modes and links as a checkout's), and its key is
// the repository's RefsKey until the repository changes.
func TestWriteCloneIsAClone(t *testing.T) {
	securitytest.Attack(t, "git", "a sandbox pushes a repository with links and executables; the host builds every fresh sandbox's /workspace from it",
		"no checkout on the host (a fetch into an empty repository, an index, git archive passed through); trees with .gitmodules or .gitattributes go to git in the sandbox; the archive names nothing of the host (no FETCH_HEAD, no reflogs, no paths)")
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	m := newManager(t, Options{})
	ctx := context.Background()
	account := newAccount()
	head := pushTree(t, m, account, map[string]string{
		"README.md":        "hello\n",
		"bin/run.sh":       "#!/bin/sh\necho run\n",
		"link":             "->README.md",
		"deep/er/file.txt": "deep\n",
	})
	const url = "http://sandboxd.internal/git/x.git"
	var buf bytes.Buffer
	key, err := m.WriteClone(ctx, account, url, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if want, err := m.RefsKey(ctx, account); err != nil || key != want {
		t.Fatalf("WriteClone's key %s, RefsKey %s (%v)", key, want, err)
	}
	// Nothing names the host: the archive goes into a sandbox.
	bare, _ := m.Path(account)
	for _, leak := range []string{bare, m.Root(), os.TempDir() + "/sandboxd-clone-"} {
		if bytes.Contains(buf.Bytes(), []byte(leak)) {
			t.Fatalf("the archive names %s", leak)
		}
	}
	dir := t.TempDir()
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = &buf
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v: %s", err, out)
	}
	if got := gitCmd(t, dir, "status", "--porcelain"); got != "" {
		t.Fatalf("status of the clone:\n%s", got)
	}
	for args, want := range map[string]string{
		"rev-parse HEAD":                         head,
		"rev-parse --abbrev-ref HEAD":            "main",
		"rev-parse --abbrev-ref HEAD@{upstream}": "origin/main",
		"remote get-url origin":                  url,
		"rev-parse origin/feature":               head,
		"tag":                                    "v1",
		"config --get remote.origin.fetch":       "+refs/heads/*:refs/remotes/origin/*",
	} {
		if got := gitCmd(t, dir, splitArgs(args)...); got != want {
			t.Errorf("git %s = %q, want %q", args, got, want)
		}
	}
	if got := gitCmd(t, dir, "ls-files", "--stage", "bin/run.sh"); got[:6] != "100755" {
		t.Errorf("bin/run.sh in the index: %s", got)
	}
	gitCmd(t, dir, "fsck", "--no-progress")
	if target, err := os.Readlink(filepath.Join(dir, "link")); err != nil || target != "README.md" {
		t.Errorf("link -> %q, %v", target, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "bin/run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/run.sh: %v, %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "README.md")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("README.md: %v, %v", fi.Mode(), err)
	}

	commitOne(t, m, account, map[string]string{"more.txt": "more"})
	if after, err := m.RefsKey(ctx, account); err != nil || after == key {
		t.Fatalf("RefsKey after a commit: %s (was %s), %v", after, key, err)
	}
}

func splitArgs(s string) []string {
	var out []string
	for _, f := range bytes.Fields([]byte(s)) {
		out = append(out, string(f))
	}
	return out
}

// TestWriteCloneNeedsCheckout: a tree with .gitattributes (which changes
// what git archive writes) or .gitmodules anywhere is ErrNeedsCheckout.
func TestWriteCloneNeedsCheckout(t *testing.T) {
	m := newManager(t, Options{})
	for _, name := range []string{".gitattributes", "sub/.gitattributes", ".gitmodules"} {
		account := newAccount()
		commitOne(t, m, account, map[string]string{"README.md": "x", name: "* export-ignore\n"})
		_, err := m.WriteClone(context.Background(), account, "http://sandboxd.internal/git/x.git", &bytes.Buffer{})
		if !errors.Is(err, ErrNeedsCheckout) {
			t.Errorf("with %s: %v, want ErrNeedsCheckout", name, err)
		}
	}
}

// TestWriteCloneEmpty: a repository without commits is an empty clone with
// its remote, as `git clone` of it makes.
func TestWriteCloneEmpty(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("no tar")
	}
	m := newManager(t, Options{})
	account := newAccount()
	if _, err := m.Ensure(context.Background(), account); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := m.WriteClone(context.Background(), account, "http://sandboxd.internal/git/x.git", &buf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = &buf
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v: %s", err, out)
	}
	if got := gitCmd(t, dir, "remote", "get-url", "origin"); got != "http://sandboxd.internal/git/x.git" {
		t.Fatalf("origin %q", got)
	}
	if _, err := gitTry(dir, "rev-parse", "-q", "--verify", "HEAD"); err == nil {
		t.Fatal("an empty repository's clone has a HEAD commit")
	}
}
