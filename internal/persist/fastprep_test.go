package persist

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/store"
)

// TestFreshWorkspaceIsUnpacked: a fresh sandbox's /workspace is the
// clone archive the agent unpacks, with no process in the sandbox; the
// next sandbox of the account gets the archive kept; a repository that
// needs a checkout runs the script.
func TestFreshWorkspaceIsUnpacked(t *testing.T) {
	f := newChainFixture(t, Options{})
	ctx := context.Background()
	if _, _, err := f.svc.opts.Repos.CommitFiles(ctx, f.account.ID, repo.MainBranch,
		[]repo.File{repo.BytesFile("README.md", []byte("hello\n")), repo.BytesFile("src/a.txt", []byte("a\n"))}, "seed", repo.DefaultAuthor); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"sbx_first", "sbx_second"} {
		sb := store.Sandbox{ID: id, AccountID: f.account.ID}
		rsb := f.rt.Add(sb.ID)
		if err := f.svc.Prepare(ctx, sb, rsb, false); err != nil {
			t.Fatal(err)
		}
		if len(rsb.Execs()) != 0 || rsb.Unpacks() != 1 {
			t.Fatalf("sandbox %d: execs %v, unpacks %d; want none and one", i, rsb.Execs(), rsb.Unpacks())
		}
		for p, want := range map[string]string{"/workspace/src/a.txt": "a\n", "/workspace/.git/HEAD": "ref: refs/heads/main\n"} {
			if b, ok := rsb.File(p); !ok || string(b) != want {
				t.Fatalf("sandbox %d: %s = %q, %v", i, p, b, ok)
			}
		}
		if cfg, _ := rsb.File("/workspace/.git/config"); !strings.Contains(string(cfg), RepoURL(f.account.ID)) {
			t.Fatalf("sandbox %d: .git/config without the remote:\n%s", i, cfg)
		}
	}
	if _, ok := f.svc.clones.byAcct[f.account.ID]; !ok {
		t.Fatal("the account's clone archive is not kept")
	}

	if _, _, err := f.svc.opts.Repos.CommitFiles(ctx, f.account.ID, repo.MainBranch,
		[]repo.File{repo.BytesFile(".gitmodules", []byte("[submodule \"x\"]\n"))}, "modules", repo.DefaultAuthor); err != nil {
		t.Fatal(err)
	}
	sb := store.Sandbox{ID: "sbx_modules", AccountID: f.account.ID}
	rsb := f.rt.Add(sb.ID)
	_ = f.svc.Prepare(ctx, sb, rsb, false) // the fake runs no script: its exit is the fake's
	if len(rsb.Execs()) == 0 || rsb.Unpacks() != 0 {
		t.Fatalf("with submodules: execs %v, unpacks %d; want the script and no unpack", rsb.Execs(), rsb.Unpacks())
	}
}

// TestRestoredCloneAtMainRunsNothing: a sandbox whose clone stands at the
// repository's main needs no script; one behind it runs the script.
func TestRestoredCloneAtMainRunsNothing(t *testing.T) {
	f := newChainFixture(t, Options{})
	ctx := context.Background()
	head, _, err := f.svc.opts.Repos.CommitFiles(ctx, f.account.ID, repo.MainBranch,
		[]repo.File{repo.BytesFile("README.md", []byte("hello\n"))}, "seed", repo.DefaultAuthor)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		at      string
		modules bool
		script  bool
	}{
		{"at main", head, false, false},
		{"behind main", strings.Repeat("0", 40), false, true},
		{"not tracking main", head, false, false},
		{"with submodules", head, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := store.Sandbox{ID: "sbx_" + strings.ReplaceAll(tc.name, " ", ""), AccountID: f.account.ID}
			rsb := f.rt.Add(sb.ID)
			files := map[string]string{
				"/workspace/README.md":                     "hello\n",
				"/workspace/.git/HEAD":                     "ref: refs/heads/main\n",
				"/workspace/.git/refs/heads/main":          tc.at + "\n",
				"/workspace/.git/refs/remotes/origin/main": tc.at + "\n",
				"/workspace/.git/config":                   "[core]\n[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n",
			}
			if tc.name == "not tracking main" {
				files["/workspace/.git/config"] = "[core]\n"
			}
			if tc.modules {
				files["/workspace/.gitmodules"] = "[submodule \"x\"]\n"
			}
			for p, c := range files {
				if err := rsb.WriteFile(ctx, p, strings.NewReader(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_ = f.svc.Prepare(ctx, sb, rsb, false)
			if ran := len(rsb.Execs()) > 0; ran != tc.script || rsb.Unpacks() != 0 {
				t.Fatalf("script ran: %v, want %v (execs %v); unpacks %d, want 0", ran, tc.script, rsb.Execs(), rsb.Unpacks())
			}
			// main tracks origin/main afterwards, as after the script.
			if cfg, _ := rsb.File("/workspace/.git/config"); !tc.script && !strings.Contains(string(cfg), "[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n") {
				t.Fatalf(".git/config:\n%s", cfg)
			}
		})
	}
}
