package persist

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/store"
)

// The account's environment row (its snapshot, its forge mirror, when the
// snapshot expires) has one owner: this service. Captures, mirror pushes,
// PATCH /api/sandboxes and the account's deletion all change it here, each
// in one transaction, so that two of them at once cannot undo each other.

// EnvironmentPatch is a change a caller asks for (PATCH /api/sandboxes):
// empty fields stay as they are.
type EnvironmentPatch struct {
	SnapshotID string // must be one of the account's snapshots
	GithubRepo string // must be the account's own mirror on the forge
}

// PatchEnvironment applies p to the account's row and returns the row as
// it is afterwards (nil when the account has none and p changes nothing).
// A snapshot that is not the account's is as unknown as a missing one; a
// repository the account may not name is refused naming the field. A
// change renews the row's expiry.
func (s *Service) PatchEnvironment(ctx context.Context, accountID string, p EnvironmentPatch) (*store.Environment, error) {
	if p.GithubRepo != "" {
		if err := s.OwnsRepo(accountID, p.GithubRepo); err != nil {
			return nil, errdefs.New(errdefs.ErrInvalid, "github_repo: "+err.Error())
		}
	}
	if p.SnapshotID != "" {
		snap, err := s.st.GetSnapshot(ctx, p.SnapshotID)
		if errors.Is(err, store.ErrNotFound) || (err == nil && snap.AccountID != accountID) {
			return nil, errdefs.New(errdefs.ErrNotFound, "Snapshot not found")
		}
		if err != nil {
			return nil, fmt.Errorf("get snapshot %s: %w", p.SnapshotID, err)
		}
	}
	var out *store.Environment
	err := s.updateEnvironment(ctx, accountID, func(env *store.Environment, found bool) bool {
		if p.SnapshotID == "" && p.GithubRepo == "" {
			if found {
				out = env
			}
			return false
		}
		if p.SnapshotID != "" {
			env.SnapshotID = &p.SnapshotID
		}
		if p.GithubRepo != "" {
			env.GithubRepo = &p.GithubRepo
		}
		env.ExpiresAt = s.opts.Now().Add(s.opts.TTL)
		out = env
		return true
	})
	return out, err
}

// setRepoURL records url as the account's github_repo.
func (s *Service) setRepoURL(ctx context.Context, accountID, url string) error {
	return s.updateEnvironment(ctx, accountID, func(env *store.Environment, found bool) bool {
		if env.GithubRepo != nil && *env.GithubRepo == url {
			return false
		}
		if !found {
			env.ExpiresAt = s.opts.Now().Add(s.opts.TTL)
		}
		env.GithubRepo = &url
		return true
	})
}

// setEnvironment makes snapshotID the account's snapshot for TTL more.
func (s *Service) setEnvironment(ctx context.Context, accountID, snapshotID string) error {
	return s.updateEnvironment(ctx, accountID, func(env *store.Environment, _ bool) bool {
		env.SnapshotID = &snapshotID
		env.ExpiresAt = s.opts.Now().Add(s.opts.TTL)
		return true
	})
}

// updateEnvironment reads the account's row (a new one when it has none),
// lets change edit it and saves it when change says so, in one
// transaction.
func (s *Service) updateEnvironment(ctx context.Context, accountID string, change func(env *store.Environment, found bool) bool) error {
	return s.st.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
		now := s.opts.Now()
		env, err := q.GetEnvironment(ctx, accountID)
		found := err == nil
		if errors.Is(err, store.ErrNotFound) {
			env = store.Environment{AccountID: accountID, CreatedAt: now}
		} else if err != nil {
			return fmt.Errorf("load environment of %s: %w", accountID, err)
		}
		if !change(&env, found) {
			return nil
		}
		env.UpdatedAt = now
		if err := q.UpsertEnvironment(ctx, &env); err != nil {
			return fmt.Errorf("save environment of %s: %w", accountID, err)
		}
		return nil
	})
}

// DeleteAccount implements sandbox.Persistence: the environment row and
// the snapshot rows go in one transaction, then the blobs nothing else
// shares and the repository.
func (s *Service) DeleteAccount(ctx context.Context, accountID string) error {
	var snaps []store.Snapshot
	err := s.st.InTx(ctx, func(_ *sql.Tx, q *store.Queries) error {
		if _, err := q.DeleteEnvironment(ctx, accountID); err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("delete environment of %s: %w", accountID, err)
		}
		var err error
		if snaps, err = q.DeleteSnapshotsOf(ctx, accountID); err != nil {
			return fmt.Errorf("delete snapshots of %s: %w", accountID, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if err := s.deleteBlobIfUnused(ctx, sn.BlobKey); err != nil {
			return err
		}
	}
	if err := s.opts.Repos.Delete(ctx, accountID); err != nil && !errors.Is(err, repo.ErrNoRepository) {
		return fmt.Errorf("delete repository of %s: %w", accountID, err)
	}
	return nil
}
