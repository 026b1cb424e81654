package files

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/store"
)

// AccountStore is what the submodule access rule reads from the database;
// *store.Store is one.
type AccountStore interface {
	GetAccount(ctx context.Context, id string) (store.Account, error)
	IsOrgMember(ctx context.Context, orgID, accountID string) (bool, error)
}

// SubmoduleAccess is the rule for following a submodule of account's
// repository into owner's repository (to read a file, or to commit an
// upload): allowed when account may act for owner under the project's one
// access rule (auth.MayActFor, asked as account's own key would be), or
// when owner is an organization account belongs to — the organizations'
// repositories are the submodules of their members' workspaces.
type SubmoduleAccess struct {
	Auth     *auth.Authenticator
	Accounts AccountStore
}

var _ repo.SubmoduleAccess = SubmoduleAccess{}

// MayUseRepository implements repo.SubmoduleAccess.
func (a SubmoduleAccess) MayUseRepository(ctx context.Context, account, owner string) (bool, error) {
	if account == owner {
		return true, nil
	}
	member, err := a.Accounts.IsOrgMember(ctx, owner, account)
	if err != nil {
		return false, fmt.Errorf("check membership of %s in %s: %w", account, owner, err)
	}
	if member {
		return true, nil
	}
	acct, err := a.Accounts.GetAccount(ctx, account)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up account %s: %w", account, err)
	}
	return a.Auth.MayActFor(ctx, auth.Principal{AccountID: acct.ID, Kind: acct.Kind}, owner)
}
