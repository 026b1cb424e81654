package repo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/go-git/go-git/v5/plumbing/filemode"
)

func TestCanonicalID(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"6f1c2f4e-8a7b-4c3d-9e2f-0a1b2c3d4e5f", "6f1c2f4e-8a7b-4c3d-9e2f-0a1b2c3d4e5f", true},
		{"6F1C2F4E-8A7B-4C3D-9E2F-0A1B2C3D4E5F", "6f1c2f4e-8a7b-4c3d-9e2f-0a1b2c3d4e5f", true},
		{"", "", false},
		{"../../etc/passwd", "", false},
		{"6f1c2f4e8a7b4c3d9e2f0a1b2c3d4e5f", "", false},
		{"{6f1c2f4e-8a7b-4c3d-9e2f-0a1b2c3d4e5f}", "", false},
		{"urn:uuid:6f1c2f4e-8a7b-4c3d-9e2f-0a1b2c3d4e5f", "", false},
		{"6f1c2f4e-8a7b-4c3d-9e2f-0a1b2c3d4e5f/../x", "", false},
	}
	for _, tc := range cases {
		got, err := CanonicalID(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("CanonicalID(%q) = %q, %v", tc.in, got, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidAccount) {
			t.Errorf("CanonicalID(%q) error %v is not ErrInvalidAccount", tc.in, err)
		}
	}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a := newAccount()

	if ok, err := m.Exists(ctx, a); err != nil || ok {
		t.Fatalf("Exists before Ensure = %v, %v", ok, err)
	}
	if _, _, err := m.Tree(ctx, a); !errors.Is(err, ErrNoRepository) {
		t.Fatalf("Tree of a missing repository: %v", err)
	}
	if _, err := m.ReadFile(ctx, a, "x"); !errors.Is(err, ErrNoRepository) {
		t.Fatalf("ReadFile of a missing repository: %v", err)
	}

	p, err := m.Ensure(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(m.Root(), a+".git") {
		t.Fatalf("path %s", p)
	}
	if p2, err := m.Ensure(ctx, a); err != nil || p2 != p {
		t.Fatalf("second Ensure = %s, %v", p2, err)
	}
	if ok, err := m.Exists(ctx, a); err != nil || !ok {
		t.Fatalf("Exists after Ensure = %v, %v", ok, err)
	}
	if head := gitCmd(t, p, "symbolic-ref", "HEAD"); head != "refs/heads/main" {
		t.Fatalf("HEAD is %s", head)
	}
	if bare := gitCmd(t, p, "rev-parse", "--is-bare-repository"); bare != "true" {
		t.Fatalf("not bare: %s", bare)
	}

	// An empty repository: an empty tree, every read not found.
	tree, _, err := m.Tree(ctx, a)
	if err != nil || tree == nil || len(tree) != 0 {
		t.Fatalf("Tree of an empty repository = %#v, %v", tree, err)
	}
	if _, err := m.ReadFile(ctx, a, "README.md"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ReadFile of an empty repository: %v", err)
	}
	if head, err := m.Head(ctx, a, MainBranch); err != nil || head != "" {
		t.Fatalf("Head of an empty repository = %q, %v", head, err)
	}

	if err := m.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("repository still on disk: %v", err)
	}
	if err := m.Delete(ctx, a); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	entries, _ := os.ReadDir(m.Root())
	if len(entries) != 1 || entries[0].Name() != ".hooks" {
		t.Fatalf("root holds more than the push hooks after Delete: %v", entries)
	}
	if _, err := m.Ensure(ctx, "../escape"); !errors.Is(err, ErrInvalidAccount) {
		t.Fatalf("Ensure of a bad id: %v", err)
	}
}

// Binary files like these must come back byte for byte.
var (
	pngBytes = append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"),
		bytes.Repeat([]byte{0x00, 0xff, 0xfe, 0x80, '\r', '\n'}, 2000)...)
	pdfBytes = []byte("%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog >>\nendobj\nstream\n\x00\x01\x02\x03\xff\xd8\xff\nendstream\n%%EOF\n")
)

func TestCommitAndRead(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a := newAccount()

	files := []File{
		BytesFile("README.md", []byte("# hello\n")),
		BytesFile("img/pixel.png", pngBytes),
		BytesFile("docs/deep/nested/report.pdf", pdfBytes),
		BytesFile("empty.txt", nil),
		{Path: "bin/run.sh", Mode: filemode.Executable, Content: strings.NewReader("#!/bin/sh\necho hi\n"), Size: 18},
		{Path: "link", Mode: filemode.Symlink, Content: strings.NewReader("README.md"), Size: 9},
	}
	commit, blobs, err := m.CommitFiles(ctx, a, MainBranch, files, "first upload", Signature{Name: "Ada", Email: "ada@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := m.Path(a)
	if got := gitCmd(t, p, "rev-parse", "main"); got != commit {
		t.Fatalf("main at %s, CommitFiles said %s", got, commit)
	}
	if out, err := gitTry(p, "fsck", "--strict", "--no-dangling"); err != nil {
		t.Fatalf("fsck: %v\n%s", err, out)
	}
	if msg := gitCmd(t, p, "log", "-1", "--format=%an <%ae>|%s|%P", "main"); msg != "Ada <ada@example.com>|first upload|" {
		t.Fatalf("commit %q", msg)
	}
	want := map[string][]byte{
		"README.md":                   []byte("# hello\n"),
		"img/pixel.png":               pngBytes,
		"docs/deep/nested/report.pdf": pdfBytes,
		"empty.txt":                   {},
		"bin/run.sh":                  []byte("#!/bin/sh\necho hi\n"),
		"link":                        []byte("README.md"),
	}
	for path, data := range want {
		got, err := m.ReadFile(ctx, a, path)
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%s: got %d bytes, want %d exact", path, len(got), len(data))
		}
		// git agrees on the blob id and the content.
		if blob := gitCmd(t, p, "rev-parse", "main:"+path); blob != blobs[path] {
			t.Fatalf("%s: blob %s, CommitFiles said %s", path, blob, blobs[path])
		}
	}
	if mode := gitCmd(t, p, "ls-tree", "main", "bin/run.sh"); !strings.HasPrefix(mode, "100755 ") {
		t.Fatalf("executable mode lost: %s", mode)
	}
	if mode := gitCmd(t, p, "ls-tree", "main", "link"); !strings.HasPrefix(mode, "120000 ") {
		t.Fatalf("symlink mode lost: %s", mode)
	}

	// A second commit replaces one file, adds one, and keeps the rest.
	commit2, _, err := m.CommitFiles(ctx, a, MainBranch, []File{
		BytesFile("README.md", []byte("# changed\n")),
		BytesFile("docs/deep/other.txt", []byte("other")),
	}, "second", Signature{})
	if err != nil {
		t.Fatal(err)
	}
	if parent := gitCmd(t, p, "rev-parse", "main^"); parent != commit {
		t.Fatalf("parent of %s is %s, want %s", commit2, parent, commit)
	}
	if got, _ := m.ReadFile(ctx, a, "README.md"); string(got) != "# changed\n" {
		t.Fatalf("README.md = %q", got)
	}
	if got, _ := m.ReadFile(ctx, a, "docs/deep/nested/report.pdf"); !bytes.Equal(got, pdfBytes) {
		t.Fatal("report.pdf lost in the second commit")
	}
	if author := gitCmd(t, p, "log", "-1", "--format=%an", "main"); author != DefaultAuthor.Name {
		t.Fatalf("default author %q", author)
	}
	if out, err := gitTry(p, "fsck", "--strict", "--no-dangling"); err != nil {
		t.Fatalf("fsck: %v\n%s", err, out)
	}

	for _, missing := range []string{"nope.txt", "docs", "docs/deep", "img/pixel.png/x", "", "/", "..", "../x"} {
		if _, err := m.ReadFile(ctx, a, missing); !errors.Is(err, ErrNotFound) {
			t.Errorf("ReadFile(%q) = %v, want not found", missing, err)
		}
	}
	// Leading slashes are tolerated, as in the API's paths.
	if got, err := m.ReadFile(ctx, a, "/img/pixel.png"); err != nil || !bytes.Equal(got, pngBytes) {
		t.Fatalf("ReadFile(/img/pixel.png): %v", err)
	}
}

func TestCommitOtherBranch(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a := newAccount()
	commitOne(t, m, a, map[string]string{"a.txt": "main"})
	sha, _, err := m.CommitFiles(ctx, a, "sandbox/abc", []File{BytesFile("b.txt", []byte("side"))}, "side", Signature{})
	if err != nil {
		t.Fatal(err)
	}
	if head, _ := m.Head(ctx, a, "sandbox/abc"); head != sha {
		t.Fatalf("branch at %s, want %s", head, sha)
	}
	// A new branch starts empty: it is not based on main.
	if _, err := m.ReadFile(ctx, a, "b.txt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("b.txt on main: %v", err)
	}
}

func TestCommitRefusals(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a := newAccount()
	first := commitOne(t, m, a, map[string]string{"dir/file.txt": "x", "top.txt": "y"})

	cases := []struct {
		name   string
		branch string
		files  []File
	}{
		{"no files", MainBranch, nil},
		{"empty path", MainBranch, []File{BytesFile("", []byte("x"))}},
		{"escaping path", MainBranch, []File{BytesFile("../x", []byte("x"))}},
		{"dot-dot inside", MainBranch, []File{BytesFile("a/../../x", []byte("x"))}},
		{".git", MainBranch, []File{BytesFile(".git/config", []byte("x"))}},
		{".GIT nested", MainBranch, []File{BytesFile("a/.GIT/hooks/x", []byte("x"))}},
		{"file over directory", MainBranch, []File{BytesFile("dir", []byte("x"))}},
		{"directory over file", MainBranch, []File{BytesFile("top.txt/x", []byte("x"))}},
		{"twice", MainBranch, []File{BytesFile("n.txt", []byte("1")), BytesFile("/n.txt", []byte("2"))}},
		{"bad mode", MainBranch, []File{{Path: "d", Mode: filemode.Dir, Content: strings.NewReader(""), Size: 0}}},
		{"no content", MainBranch, []File{{Path: "d"}}},
		{"bad branch", "no..dots", []File{BytesFile("z", []byte("z"))}},
		{"empty branch", "", []File{BytesFile("z", []byte("z"))}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := m.CommitFiles(ctx, a, tc.branch, tc.files, "bad", Signature{})
			if !errors.Is(err, ErrInvalidPath) {
				t.Fatalf("err = %v, want ErrInvalidPath", err)
			}
			if head, _ := m.Head(ctx, a, MainBranch); head != first {
				t.Fatalf("main moved to %s", head)
			}
		})
	}
}

func TestCommitShortContent(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a := newAccount()
	first := commitOne(t, m, a, map[string]string{"a": "a"})
	p, _ := m.Path(a)
	before := countObjects(t, p)
	for _, f := range []File{
		{Path: "short", Content: strings.NewReader("abc"), Size: 10},
		{Path: "long", Content: strings.NewReader("abcdefghijk"), Size: 10},
	} {
		if _, _, err := m.CommitFiles(ctx, a, MainBranch, []File{f}, "x", Signature{}); err == nil {
			t.Fatalf("%s: committed content of the wrong size", f.Path)
		}
	}
	if head, _ := m.Head(ctx, a, MainBranch); head != first {
		t.Fatalf("main moved to %s", head)
	}
	if after := countObjects(t, p); after != before {
		t.Fatalf("objects directory went from %d to %d files: a failed write left something", before, after)
	}
}

// countObjects counts the files under objects/, temporary ones included.
func countObjects(t *testing.T, repoPath string) int {
	n := 0
	err := filepath.WalkDir(filepath.Join(repoPath, "objects"), func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConcurrentCommits(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a := newAccount()
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, _, err := m.CommitFiles(ctx, a, MainBranch, []File{BytesFile(fmt.Sprintf("f/%02d.txt", i), []byte(fmt.Sprint(i)))}, fmt.Sprint("commit ", i), Signature{})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	p, _ := m.Path(a)
	if count := gitCmd(t, p, "rev-list", "--count", "main"); count != fmt.Sprint(n) {
		t.Fatalf("%s commits, want %d", count, n)
	}
	tree, _, err := m.Tree(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if len(tree) != n+1 { // f and its n files
		t.Fatalf("tree has %d entries, want %d", len(tree), n+1)
	}
}

// TestCommitRacingPush makes a push land between a commit's tree building
// and its branch update: the commit must be rebuilt on the pushed head, so
// both survive.
func TestCommitRacingPush(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a := newAccount()
	commitOne(t, m, a, map[string]string{"base.txt": "base"})
	p, _ := m.Path(a)
	wt := t.TempDir()
	gitCmd(t, wt, "clone", "-q", p, ".")

	pushes := 0
	m.beforeUpdateRef = func(repoPath string) {
		if pushes >= 2 {
			return // let the third attempt through
		}
		pushes++
		name := fmt.Sprintf("pushed-%d.txt", pushes)
		if err := os.WriteFile(filepath.Join(wt, name), []byte("pushed"), 0o644); err != nil {
			t.Error(err)
		}
		gitCmd(t, wt, "add", name)
		gitCmd(t, wt, "commit", "-q", "-m", "push "+name)
		gitCmd(t, wt, "push", "-q", "origin", "HEAD:main")
	}
	sha, _, err := m.CommitFiles(ctx, a, MainBranch, []File{BytesFile("uploaded.txt", []byte("up"))}, "upload", Signature{})
	if err != nil {
		t.Fatal(err)
	}
	m.beforeUpdateRef = nil
	if head := gitCmd(t, p, "rev-parse", "main"); head != sha {
		t.Fatalf("main at %s, want %s", head, sha)
	}
	for _, f := range []string{"base.txt", "pushed-1.txt", "pushed-2.txt", "uploaded.txt"} {
		if _, err := m.ReadFile(ctx, a, f); err != nil {
			t.Fatalf("%s lost: %v", f, err)
		}
	}
	if count := gitCmd(t, p, "rev-list", "--count", "main"); count != "4" {
		t.Fatalf("history has %s commits, want 4 (linear)", count)
	}
}

func TestTree(t *testing.T) {
	ctx := context.Background()
	m := newManager(t, Options{})
	a, b := newAccount(), newAccount()
	subCommit := commitOne(t, m, b, map[string]string{"lib.txt": "lib"})
	commitOne(t, m, a, map[string]string{"z.txt": "zz", "a/b/c.bin": "\x00\x01\x02", "a/x.txt": "x"})
	setGitlinks(t, m, a, map[string][2]string{"vendor/b": {"../" + b + ".git", subCommit}})

	tree, _, err := m.Tree(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range tree {
		got = append(got, fmt.Sprintf("%s %s %o %d", e.Path, e.Type, e.Mode, e.Size))
		if len(e.SHA) != 40 {
			t.Fatalf("entry %+v has no object id", e)
		}
	}
	want := []string{
		".gitmodules blob 100644 " + fmt.Sprint(len("[submodule \"vendor/b\"]\n\tpath = vendor/b\n\turl = ../"+b+".git\n")),
		"a tree 40000 -1",
		"a/b tree 40000 -1",
		"a/b/c.bin blob 100644 3",
		"a/x.txt blob 100644 1",
		"vendor tree 40000 -1",
		"vendor/b commit 160000 -1",
		"z.txt blob 100644 2",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("tree:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, e := range tree {
		if e.Path == "vendor/b" && e.SHA != subCommit {
			t.Fatalf("gitlink names %s, want %s", e.SHA, subCommit)
		}
	}

	// Cached listings are copies: changing one does not change the next.
	tree[0].Path = "changed"
	again, _, _ := m.Tree(ctx, a)
	if again[0].Path != ".gitmodules" {
		t.Fatal("the cached listing was modified through a returned slice")
	}
}

func TestParseLsTree(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []Entry
		ok   bool
	}{
		{"empty", "", []Entry{}, true},
		{"blob", "100644 blob 0123456789012345678901234567890123456789      12\tdir/a b.txt\x00",
			[]Entry{{Path: "dir/a b.txt", Type: "blob", Mode: 0o100644, SHA: "0123456789012345678901234567890123456789", Size: 12}}, true},
		{"tab and newline in name", "100644 blob 0123456789012345678901234567890123456789 1\ta\tb\nc\x00",
			[]Entry{{Path: "a\tb\nc", Type: "blob", Mode: 0o100644, SHA: "0123456789012345678901234567890123456789", Size: 1}}, true},
		{"tree", "040000 tree 0123456789012345678901234567890123456789       -\tdir\x00",
			[]Entry{{Path: "dir", Type: "tree", Mode: 0o40000, SHA: "0123456789012345678901234567890123456789", Size: -1}}, true},
		{"unterminated", "100644 blob 0123456789012345678901234567890123456789 1\ta", nil, false},
		{"no tab", "100644 blob 0123456789012345678901234567890123456789 1 a\x00", nil, false},
		{"bad size", "100644 blob 0123456789012345678901234567890123456789 x\ta\x00", nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := parseLsTree(bufio.NewReader(strings.NewReader(tc.in)), 0, 0)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v", err)
			}
			if tc.ok && fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// BenchmarkTree10k lists a repository of 10,000 files in 800 directories,
// uncached (a fresh cache each iteration: one git ls-tree) and cached, with
// the objects loose (as CommitFiles leaves them below gc.auto) and packed
// (as pushes and git gc leave them).
func BenchmarkTree10k(b *testing.B) {
	ctx := context.Background()
	m := newManager(b, Options{})
	a := newAccount()
	p, err := m.Ensure(ctx, a)
	if err != nil {
		b.Fatal(err)
	}
	gitCmd(b, p, "config", "gc.auto", "0") // keep the objects loose for now
	files := make([]File, 0, 10000)
	for i := range 10000 {
		files = append(files, BytesFile(fmt.Sprintf("dir%02d/sub%d/file%05d.txt", i%100, i%7, i), []byte(fmt.Sprintf("%d %s", i, strings.Repeat("x", i%500)))))
	}
	if _, _, err := m.CommitFiles(ctx, a, MainBranch, files, "10k files", Signature{}); err != nil {
		b.Fatal(err)
	}
	const want = 10000 + 100 + 700
	uncached := func(b *testing.B) {
		for b.Loop() {
			m.treeCache = newLRU(1)
			tree, _, err := m.Tree(ctx, a)
			if err != nil || len(tree) != want {
				b.Fatalf("%d entries, %v", len(tree), err)
			}
		}
	}
	b.Run("loose/uncached", uncached)
	gitCmd(b, p, "repack", "-adq")
	gitCmd(b, p, "prune-packed")
	b.Run("packed/uncached", uncached)
	b.Run("packed/cached", func(b *testing.B) {
		for b.Loop() {
			if tree, _, err := m.Tree(ctx, a); err != nil || len(tree) != want {
				b.Fatalf("%d entries, %v", len(tree), err)
			}
		}
	})
}
