// Package persisttest builds a real persist.Service for tests of other
// packages: local blobs and repositories in the test's temporary
// directories, on the store the test gives.
package persisttest

import (
	"testing"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/store"
)

// New returns a Service on st with opts; the blob store, the repositories
// and the directories it needs are fresh temporary ones.
func New(t testing.TB, st *store.Store, opts persist.Options) *persist.Service {
	t.Helper()
	blobs, err := blob.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	repos, err := repo.New(repo.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	opts.Store, opts.Blobs, opts.Repos = st, blobs, repos
	opts.BaseDir, opts.TempDir = t.TempDir(), t.TempDir()
	svc, err := persist.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
