package repo

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
)

func newManager(t testing.TB, opts Options) *Manager {
	t.Helper()
	if opts.Root == "" {
		opts.Root = filepath.Join(t.TempDir(), "repos")
	}
	m, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// gitTestEnv is a hermetic environment for the git client in tests.
func gitTestEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	return append(env, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com",
		"GIT_ALLOW_PROTOCOL=file:http:https")
}

// gitCmd runs the git client in dir and returns its trimmed output,
// failing the test on error.
func gitCmd(t testing.TB, dir string, args ...string) string {
	t.Helper()
	out, err := gitTry(dir, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func gitTry(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = gitTestEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return strings.TrimSpace(out.String()), err
}

func newAccount() string { return uuid.NewString() }

// commitOne commits files (path → content) to main and returns the commit.
func commitOne(t testing.TB, m *Manager, account string, files map[string]string) string {
	t.Helper()
	var fs []File
	for p, c := range files {
		fs = append(fs, BytesFile(p, []byte(c)))
	}
	sha, _, err := m.CommitFiles(context.Background(), account, MainBranch, fs, "test commit", Signature{})
	if err != nil {
		t.Fatal(err)
	}
	return sha
}

// setGitlinks commits .gitmodules and gitlinks into account's repository
// with the git client (CommitFiles writes only files): links maps a path to
// its URL and commit; an empty commit lists the path in .gitmodules only.
func setGitlinks(t testing.TB, m *Manager, account string, links map[string][2]string) {
	t.Helper()
	repoPath, err := m.Ensure(context.Background(), account)
	if err != nil {
		t.Fatal(err)
	}
	wt := t.TempDir()
	gitCmd(t, wt, "clone", "-q", repoPath, ".")
	var mods strings.Builder
	for p, l := range links {
		mods.WriteString("[submodule \"" + p + "\"]\n\tpath = " + p + "\n\turl = " + l[0] + "\n")
		if l[1] != "" {
			gitCmd(t, wt, "update-index", "--add", "--cacheinfo", "160000,"+l[1]+","+p)
		}
	}
	if err := os.WriteFile(filepath.Join(wt, ".gitmodules"), []byte(mods.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	gitCmd(t, wt, "add", ".gitmodules")
	gitCmd(t, wt, "commit", "-q", "-m", "add submodules")
	gitCmd(t, wt, "push", "-q", "origin", "HEAD:main")
}
