package repo

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/securitytest"
)

// writeFile writes data to dir/name, failing the test on error.
func writeFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func TestReadFileTooLarge(t *testing.T) {
	securitytest.Attack(t, "git objects",
		"a tenant pushes a blob of zeros that git compresses to a few KiB but that inflates past the read limit, plain and as a delta of a small blob, then reads it through ReadFile",
		"ReadFile refuses it (TooLargeError with its size) from the object's header before reading content; files within the limit still read")
	ctx := context.Background()
	f := newGitServerWith(t, Limits{MaxReadBytes: 1 << 20})
	wt := t.TempDir()
	gitCmd(t, wt, "init", "-q")
	zeros := make([]byte, 8<<20)
	writeFile(t, wt, "zeros.bin", zeros)
	writeFile(t, wt, "small.txt", []byte("small"))
	// A second large file nearly identical to the first: git stores it
	// as a delta, whose inflated size only its delta header tells.
	zeros[len(zeros)-1] = 1
	writeFile(t, wt, "delta.bin", zeros)
	gitCmd(t, wt, "add", ".")
	gitCmd(t, wt, "commit", "-q", "-m", "bomb")
	gitCmd(t, wt, "push", "-q", f.url(f.alice.ID, f.aliceKey), "HEAD:main")

	// The repository is packed by the push: the objects are compressed.
	if used, err := f.m.Usage(ctx, f.alice.ID); err != nil || used > 2<<20 {
		t.Fatalf("repository takes %d bytes (%v); the push was meant to be small", used, err)
	}
	for _, p := range []string{"zeros.bin", "delta.bin"} {
		_, err := f.m.ReadFile(ctx, f.alice.ID, p)
		var big *TooLargeError
		if !errors.As(err, &big) || !errors.Is(err, ErrTooLarge) || big.Size != 8<<20 || big.Limit != 1<<20 {
			t.Fatalf("read %s: %v, want a TooLargeError of 8 MiB over 1 MiB", p, err)
		}
	}
	if got, err := f.m.ReadFile(ctx, f.alice.ID, "small.txt"); err != nil || string(got) != "small" {
		t.Fatalf("small file = %q, %v", got, err)
	}
}

// pushTreeBomb pushes to url a commit whose tree names one subtree width
// times, depth levels deep: width^depth files from a handful of objects.
func pushTreeBomb(t *testing.T, url string, width, depth int) {
	t.Helper()
	wt := t.TempDir()
	gitCmd(t, wt, "init", "-q")
	blob := gitIn(t, wt, "", "hash-object", "-w", "--stdin")
	var tree string
	for level := 0; level < depth; level++ {
		var b strings.Builder
		for i := 0; i < width; i++ {
			if level == 0 {
				fmt.Fprintf(&b, "100644 blob %s\tf%02d\n", blob, i)
			} else {
				fmt.Fprintf(&b, "040000 tree %s\td%02d\n", tree, i)
			}
		}
		tree = gitIn(t, wt, b.String(), "mktree")
	}
	commit := gitIn(t, wt, "", "commit-tree", "-m", "bomb", tree)
	gitCmd(t, wt, "push", "-q", url, commit+":refs/heads/main")
}

func newGitCmd(dir string, args ...string) *exec.Cmd {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = gitTestEnv()
	return cmd
}

// gitIn runs git in dir with stdin and returns its trimmed output.
func gitIn(t *testing.T, dir, stdin string, args ...string) string {
	t.Helper()
	cmd := newGitCmd(dir, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

func TestTreeBomb(t *testing.T) {
	securitytest.Attack(t, "git objects",
		"a tenant pushes a tree bomb (7 objects: trees naming one subtree 16 times, 5 levels deep, 1,118,481 paths) and lists its tree",
		"the listing stops at the entry limit, says it is truncated, and answers in well under a second; a path-bytes limit cuts it too")
	ctx := context.Background()
	f := newGitServerWith(t, Limits{TreeMaxEntries: 1000})
	pushTreeBomb(t, f.url(f.alice.ID, f.aliceKey), 16, 5)

	start := time.Now()
	entries, truncated, err := f.m.Tree(ctx, f.alice.ID)
	took := time.Since(start)
	if err != nil || !truncated || len(entries) != 1000 {
		t.Fatalf("Tree = %d entries, truncated %v, %v; want 1000, truncated", len(entries), truncated, err)
	}
	if took > 5*time.Second {
		t.Fatalf("Tree took %v", took)
	}
	// The cached answer is truncated too.
	if again, truncated, _ := f.m.Tree(ctx, f.alice.ID); len(again) != 1000 || !truncated {
		t.Fatalf("cached Tree = %d entries, truncated %v", len(again), truncated)
	}
	t.Logf("tree bomb listed (cut at 1000 entries) in %v", took)

	// The path bytes limit alone cuts it as well.
	m := newManager(t, Options{Root: f.m.Root(), Limits: Limits{TreeMaxEntries: -1, TreeMaxPathBytes: 10 << 10}})
	entries, truncated, err = m.Tree(ctx, f.alice.ID)
	var n int
	for _, e := range entries {
		n += len(e.Path)
	}
	if err != nil || !truncated || n > 10<<10 || n < 9<<10 {
		t.Fatalf("Tree by path bytes = %d entries of %d path bytes, truncated %v, %v", len(entries), n, truncated, err)
	}

	// A small tree is not truncated.
	commitOne(t, f.m, f.bob.ID, map[string]string{"a.txt": "a", "d/b.txt": "b"})
	if entries, truncated, err := f.m.Tree(ctx, f.bob.ID); err != nil || truncated || len(entries) != 3 {
		t.Fatalf("small Tree = %v, truncated %v, %v", entries, truncated, err)
	}
}

func TestPushLimits(t *testing.T) {
	ctx := context.Background()
	refOf := func(f gitServerFixture, account string) string {
		h, err := f.m.Head(ctx, account, MainBranch)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	// pushFiles commits files into a fresh history on top of what main
	// has and pushes it; it returns git's output and error.
	pushFiles := func(f gitServerFixture, wt string, files map[string][]byte) (string, error) {
		for name, data := range files {
			writeFile(t, wt, name, data)
		}
		gitCmd(t, wt, "add", ".")
		gitCmd(t, wt, "commit", "-q", "-m", "push")
		return gitTry(wt, "push", "origin", "HEAD:main")
	}
	clone := func(f gitServerFixture) string {
		wt := filepath.Join(t.TempDir(), "wt")
		gitCmd(t, "", "clone", "-q", f.url(f.alice.ID, f.aliceKey), wt)
		return wt
	}

	t.Run("repository quota", func(t *testing.T) {
		securitytest.Attack(t, "git objects",
			"a tenant pushes incompressible data until its repository passes the account's quota (1 MiB here)",
			"the push that would pass it is refused by the pre-receive hook with a message naming the quota; the branch does not move and the pushed objects are not kept")
		f := newGitServerWith(t, Limits{QuotaBytes: 1 << 20})
		wt := clone(f)
		if out, err := pushFiles(f, wt, map[string][]byte{"a.bin": randomBytes(600 << 10)}); err != nil {
			t.Fatalf("push within the quota: %v\n%s", err, out)
		}
		before, _ := f.m.Usage(ctx, f.alice.ID)
		head := refOf(f, f.alice.ID)
		out, err := pushFiles(f, wt, map[string][]byte{"b.bin": randomBytes(600 << 10)})
		if err == nil || !strings.Contains(out, "over the account's quota of 1 MiB") {
			t.Fatalf("push past the quota: %v\n%s", err, out)
		}
		if refOf(f, f.alice.ID) != head {
			t.Fatal("main moved")
		}
		after, _ := f.m.Usage(ctx, f.alice.ID)
		if after > before+64<<10 {
			t.Fatalf("repository grew from %d to %d bytes", before, after)
		}
		// Commits made here are refused by the same quota, before writing.
		_, _, err = f.m.CommitFiles(ctx, f.alice.ID, MainBranch, []File{BytesFile("c.bin", randomBytes(600<<10))}, "c", Signature{})
		var q *QuotaError
		if !errors.As(err, &q) || q.Quota != 1<<20 || q.Adding != 600<<10 {
			t.Fatalf("commit past the quota: %v", err)
		}
		if now, _ := f.m.Usage(ctx, f.alice.ID); now != after || refOf(f, f.alice.ID) != head {
			t.Fatalf("a refused commit wrote: %d → %d bytes", after, now)
		}
		// Deleting a branch adds nothing and still works on a full
		// repository.
		gitCmd(t, wt, "push", "-q", "origin", "HEAD~1:refs/heads/old")
		if out, err := gitTry(wt, "push", "origin", ":refs/heads/old"); err != nil {
			t.Fatalf("delete a branch: %v\n%s", err, out)
		}
	})

	t.Run("objects per push", func(t *testing.T) {
		securitytest.Attack(t, "git objects",
			"a tenant pushes more objects in one push than the limit (50 files with a limit of 20 objects)",
			"the pre-receive hook refuses the push with a message saying so; the branch does not move")
		f := newGitServerWith(t, Limits{MaxPushObjects: 20})
		wt := clone(f)
		files := map[string][]byte{}
		for i := range 50 {
			files[fmt.Sprintf("f%02d.txt", i)] = []byte(fmt.Sprint(i))
		}
		out, err := pushFiles(f, wt, files)
		if err == nil || !strings.Contains(out, "more than the 20 one push may have") {
			t.Fatalf("push of 52 objects: %v\n%s", err, out)
		}
		if refOf(f, f.alice.ID) != "" {
			t.Fatal("main was created")
		}
	})

	t.Run("push size", func(t *testing.T) {
		securitytest.Attack(t, "git objects",
			"a tenant sends packs larger than the push limit (1.5 MiB and 3 MiB of random data over a 1 MiB limit)",
			"git's index-pack stops reading at receive.maxInputSize, and a chunked body past the limit and 1 MiB is refused with 413 before git runs; the branch does not move and nothing is kept")
		f := newGitServerWith(t, Limits{MaxPushBytes: 1 << 20})
		wt := clone(f)
		for _, c := range []struct {
			size int
			want string
		}{{3 << 19, "exceeds maximum allowed size"}, {3 << 20, "HTTP 413"}} {
			out, err := pushFiles(f, wt, map[string][]byte{"big.bin": randomBytes(c.size)})
			if err == nil || !strings.Contains(out, c.want) {
				t.Fatalf("push of %d bytes: %v\n%s", c.size, err, out)
			}
			if refOf(f, f.alice.ID) != "" {
				t.Fatal("main was created")
			}
			if used, _ := f.m.Usage(ctx, f.alice.ID); used > 512<<10 {
				t.Fatalf("repository takes %d bytes after a refused push", used)
			}
		}
		if entries, _ := os.ReadDir(f.m.Root()); len(entries) != 2 {
			t.Fatalf("root holds %v; spooled bodies were left behind", entries)
		}
	})
}

func TestGitRepeatedParameters(t *testing.T) {
	securitytest.Attack(t, "git server",
		"a member of an organization, who may only fetch its repository, asks info/refs with ?service=git-upload-pack&service=git-receive-pack (authorised on the first value, executed by http-backend on the last), and sends two Authorization headers",
		"repeated query parameters are refused with 400 before any access check, and repeated credentials with 401, as the API refuses them")
	f := newGitServerWith(t, Limits{})
	base := f.srv.URL + GitPathPrefix + f.acme.ID + ".git/info/refs"
	do := func(rawQuery string, header http.Header) int {
		t.Helper()
		req, _ := http.NewRequest("GET", base+"?"+rawQuery, nil)
		for k, vs := range header {
			for _, v := range vs {
				req.Header.Add(k, v)
			}
		}
		if header == nil {
			req.SetBasicAuth("x", f.aliceKey)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, q := range []string{
		"service=git-upload-pack&service=git-receive-pack",
		"service=git-upload-pack&servic%65=git-receive-pack",
		"service=git-upload-pack&x=1&x=2",
		"service=git-upload-pack;service=git-receive-pack",
	} {
		if got := do(q, nil); got != http.StatusBadRequest {
			t.Errorf("?%s: status %d, want 400", q, got)
		}
	}
	if got := do("service=git-upload-pack", nil); got != http.StatusOK {
		t.Fatalf("one service: status %d", got)
	}
	basic := func(key string) string {
		req, _ := http.NewRequest("GET", "/", nil)
		req.SetBasicAuth("x", key)
		return req.Header.Get("Authorization")
	}
	for name, h := range map[string]http.Header{
		"two basic":           {"Authorization": {basic(f.aliceKey), basic(f.bobKey)}},
		"same basic twice":    {"Authorization": {basic(f.aliceKey), basic(f.aliceKey)}},
		"basic and bearer":    {"Authorization": {basic(f.bobKey), "Bearer " + f.aliceKey}},
		"an empty one first":  {"Authorization": {"", basic(f.aliceKey)}},
		"acme's then alice's": {"Authorization": {"Bearer " + f.acmeKey, "Bearer " + f.aliceKey}},
	} {
		if got := do("service=git-upload-pack", h); got != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, got)
		}
	}
	if got := do("service=git-upload-pack", http.Header{"Authorization": {basic(f.aliceKey)}}); got != http.StatusOK {
		t.Fatalf("one Authorization: status %d", got)
	}
}

func TestSubmoduleWriteReadOnly(t *testing.T) {
	securitytest.Attack(t, "git objects",
		"an account commits a file into a submodule whose repository it may read but not write (an organization's, for its member)",
		"the commit is refused with ErrReadOnly before anything is written in either repository; a repository it may not even read stays ErrNotFound")
	ctx := context.Background()
	var asked []Use
	readOnly := AccessFunc(func(_ context.Context, _, _ string, use Use) (bool, error) {
		asked = append(asked, use)
		return use == UseRead, nil
	})
	f := newSubmoduleFixture(t, readOnly)
	aHead, _ := f.m.Head(ctx, f.a, MainBranch)
	bHead, _ := f.m.Head(ctx, f.b, MainBranch)
	if _, err := f.m.ReadFile(ctx, f.a, "mods/b/lib/x.txt"); err != nil {
		t.Fatalf("read through a readable submodule: %v", err)
	}
	_, _, err := f.m.CommitFiles(ctx, f.a, MainBranch, []File{BytesFile("mods/b/new.txt", []byte("x")), BytesFile("top.txt", []byte("y"))}, "x", Signature{})
	if !errors.Is(err, ErrReadOnly) {
		t.Fatalf("write through a read-only submodule: %v", err)
	}
	if a, _ := f.m.Head(ctx, f.a, MainBranch); a != aHead {
		t.Fatal("the parent moved")
	}
	if b, _ := f.m.Head(ctx, f.b, MainBranch); b != bHead {
		t.Fatal("the submodule's repository moved")
	}
	if !slices.Contains(asked, UseWrite) {
		t.Fatalf("access asked %v, never for writing", asked)
	}
}
