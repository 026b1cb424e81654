package repo

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/uuid"
)

// memShared is Shared in memory, for tests: what package cluster keeps in
// PostgreSQL and the blob store (a process boundary this package does not
// own). One mutex stands for the per-repository lock over the nodes.
type memShared struct {
	lock    sync.Mutex // held by Change
	mu      sync.Mutex // guards the rest
	states  map[string]SharedState
	bundles map[string][]byte
	failPut error
}

func newMemShared() *memShared {
	return &memShared{states: map[string]SharedState{}, bundles: map[string][]byte{}}
}

func (s *memShared) Latest(_ context.Context, account string) (SharedState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.states[account], nil
}

func (s *memShared) Change(_ context.Context, account string, fn func(SharedState) (*SharedState, error)) error {
	s.lock.Lock()
	defer s.lock.Unlock()
	cur, _ := s.Latest(context.Background(), account)
	next, err := fn(cur)
	if err != nil || next == nil {
		return err
	}
	if next.Version != cur.Version+1 {
		return fmt.Errorf("version %d after %d", next.Version, cur.Version)
	}
	s.mu.Lock()
	s.states[account] = *next
	s.mu.Unlock()
	return nil
}

func (s *memShared) PutBundle(_ context.Context, path string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failPut != nil {
		return "", s.failPut
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	key := hex.EncodeToString(sum[:])
	s.bundles[key] = b
	return key, nil
}

func (s *memShared) OpenBundle(_ context.Context, key string) (io.ReadCloser, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bundles[key]
	if !ok {
		return nil, fmt.Errorf("bundle %s: %w", key, os.ErrNotExist)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (s *memShared) DropBundle(_ context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.states {
		if st.Bundle == key {
			return nil
		}
	}
	delete(s.bundles, key)
	return nil
}

// TestSharedRepositories: two nodes (Managers on their own roots) share
// their repositories: what one commits the other reads at once, a commit
// on either builds on the other's (none lost, also when they commit at
// the same time), a deletion reaches both, and a change that could not be
// published is acknowledged nowhere and read nowhere.
func TestSharedRepositories(t *testing.T) {
	ctx := context.Background()
	shared := newMemShared()
	a := newManager(t, Options{Shared: shared})
	b := newManager(t, Options{Shared: shared})
	acct := uuid.NewString()
	commit := func(m *Manager, path, content string) error {
		_, _, err := m.CommitFiles(ctx, acct, MainBranch, []File{BytesFile(path, []byte(content))}, "test", DefaultAuthor)
		return err
	}
	read := func(m *Manager, path string) string {
		t.Helper()
		data, err := m.ReadFile(ctx, acct, path)
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		return string(data)
	}
	if err := commit(a, "one.txt", "from a"); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Exists(ctx, acct); err != nil || !ok {
		t.Fatalf("node b does not see the repository node a made: %v %v", ok, err)
	}
	if got := read(b, "one.txt"); got != "from a" {
		t.Fatalf("node b reads %q", got)
	}
	if err := commit(b, "two.txt", "from b"); err != nil {
		t.Fatal(err)
	}
	if got := read(a, "one.txt") + read(a, "two.txt"); got != "from afrom b" {
		t.Fatalf("node a after b's commit: %q", got)
	}

	// At the same time on both: every commit lands.
	var wg sync.WaitGroup
	errs := make([]error, 10)
	for i := range 10 {
		m := a
		if i%2 == 1 {
			m = b
		}
		wg.Go(func() { errs[i] = commit(m, fmt.Sprintf("c%d.txt", i), fmt.Sprint(i)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		for _, m := range []*Manager{a, b} {
			if got := read(m, fmt.Sprintf("c%d.txt", i)); got != fmt.Sprint(i) {
				t.Fatalf("c%d.txt reads %q", i, got)
			}
		}
	}

	// A change that could not be published is nowhere.
	shared.mu.Lock()
	shared.failPut = errors.New("the store is down")
	shared.mu.Unlock()
	if err := commit(a, "lost.txt", "x"); err == nil {
		t.Fatal("a commit that could not be published succeeded")
	}
	shared.mu.Lock()
	shared.failPut = nil
	shared.mu.Unlock()
	for _, m := range []*Manager{a, b} {
		if _, err := m.ReadFile(ctx, acct, "lost.txt"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the unpublished commit can be read: %v", err)
		}
	}
	if err := commit(a, "three.txt", "after"); err != nil {
		t.Fatal(err)
	}
	if got := read(b, "three.txt") + read(b, "two.txt"); got != "afterfrom b" {
		t.Fatalf("after a failed publish: %q", got)
	}

	// Deleted on one, gone on both.
	if err := b.Delete(ctx, acct); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Manager{a, b} {
		if ok, err := m.Exists(ctx, acct); err != nil || ok {
			t.Fatalf("the deleted repository still exists: %v %v", ok, err)
		}
		if _, err := os.Stat(filepath.Join(m.root, acct+".git")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a copy of the deleted repository is left: %v", err)
		}
	}
	shared.mu.Lock()
	n := len(shared.bundles)
	shared.mu.Unlock()
	if n != 0 {
		t.Errorf("%d bundles left after the deletion", n)
	}
}

// TestSharedGitPush: a push to one node's git server is published before
// git is told it landed, and a clone from another node's has it; a push
// through that other node builds on it.
func TestSharedGitPush(t *testing.T) {
	shared := newMemShared()
	f := newGitServerOpts(t, Options{Shared: shared})
	b := newManager(t, Options{Shared: shared})
	bSrv := serveGit(t, b, f.authn)
	urlOn := func(srv *httptest.Server) string {
		u, _ := url.Parse(srv.URL + GitPathPrefix + f.alice.ID + ".git")
		u.User = url.UserPassword("x", f.aliceKey)
		return u.String()
	}
	wt := filepath.Join(t.TempDir(), "a")
	gitCmd(t, "", "clone", "-q", urlOn(f.srv), wt)
	os.WriteFile(filepath.Join(wt, "pushed.txt"), []byte("through a"), 0o644)
	gitCmd(t, wt, "add", ".")
	gitCmd(t, wt, "commit", "-q", "-m", "on a")
	gitCmd(t, wt, "push", "-q", "origin", "HEAD:main")

	wt2 := filepath.Join(t.TempDir(), "b")
	gitCmd(t, "", "clone", "-q", urlOn(bSrv), wt2)
	if got, err := os.ReadFile(filepath.Join(wt2, "pushed.txt")); err != nil || string(got) != "through a" {
		t.Fatalf("clone from node b: %q %v", got, err)
	}
	os.WriteFile(filepath.Join(wt2, "second.txt"), []byte("through b"), 0o644)
	gitCmd(t, wt2, "add", ".")
	gitCmd(t, wt2, "commit", "-q", "-m", "on b")
	gitCmd(t, wt2, "push", "-q", "origin", "HEAD:main")
	if got, err := f.m.ReadFile(context.Background(), f.alice.ID, "second.txt"); err != nil || string(got) != "through b" {
		t.Fatalf("node a after the push through b: %q %v", got, err)
	}
}

// BenchmarkCommitShared times a commit of one small file to a repository
// of 200 files alone (one node) and shared (published as a bundle of the
// whole repository before it returns, here into memory: a cluster adds the
// upload to its blob store and a database round trip), next to each other.
func BenchmarkCommitShared(b *testing.B) {
	for _, mode := range []string{"alone", "shared"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			opts := Options{}
			if mode == "shared" {
				opts.Shared = newMemShared()
			}
			m := newManager(b, opts)
			acct := uuid.NewString()
			var files []File
			for i := range 200 {
				files = append(files, BytesFile(fmt.Sprintf("src/f%03d.go", i), bytes.Repeat([]byte("package src\n"), 100)))
			}
			if _, _, err := m.CommitFiles(ctx, acct, MainBranch, files, "seed", DefaultAuthor); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				f := []File{BytesFile("note.txt", []byte(fmt.Sprint(i)))}
				if _, _, err := m.CommitFiles(ctx, acct, MainBranch, f, "note", DefaultAuthor); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
