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
}

// SubmoduleAccess is the rule for following a submodule of account's
// repository into owner's repository, asked as account's own key would be:
// to read a file, auth.MayRead (which lets an organization's members read
// its repository — the organizations' repositories are the submodules of
// their members' workspaces); to commit an upload, auth.MayWrite, the rule
// git push follows, so that no path writes where a push may not.
type SubmoduleAccess struct {
	Auth     *auth.Authenticator
	Accounts AccountStore
}

var _ repo.SubmoduleAccess = SubmoduleAccess{}

// MayUseRepository implements repo.SubmoduleAccess.
func (a SubmoduleAccess) MayUseRepository(ctx context.Context, account, owner string, use repo.Use) (bool, error) {
	if account == owner {
		return true, nil
	}
	acct, err := a.Accounts.GetAccount(ctx, account)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up account %s: %w", account, err)
	}
	p := auth.Principal{AccountID: acct.ID, Kind: acct.Kind}
	if use == repo.UseWrite {
		return a.Auth.MayWrite(ctx, p, owner)
	}
	return a.Auth.MayRead(ctx, p, owner)
}
