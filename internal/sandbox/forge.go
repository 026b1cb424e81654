package sandbox

import (
	"context"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/forge"
)

// ForgeMirror is implemented by a Persistence that mirrors the accounts'
// repositories to a forge (GitHub) from the host.
type ForgeMirror interface {
	// OwnsRepo is nil when url is not on the forge, or is accountID's own
	// mirror there (see forge.Mirror.OwnsRepo).
	OwnsRepo(accountID, url string) error
	// MirrorNow pushes the account's repository to its mirror now.
	MirrorNow(ctx context.Context, accountID string) (forge.Repo, error)
}

// CheckRepoURL refuses (errdefs.ErrInvalid, 400) a repository URL on the forge
// that is not accountID's own mirror: sandboxd's token acts only there.
// For PATCH github_repo and the coding agent's repo_url.
func (m *Manager) CheckRepoURL(accountID, url string) error {
	fm, ok := m.cfg.Persist.(ForgeMirror)
	if !ok {
		return nil
	}
	if err := fm.OwnsRepo(accountID, url); err != nil {
		return errdefs.New(errdefs.ErrInvalid, err.Error())
	}
	return nil
}
