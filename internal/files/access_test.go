package files

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestSubmoduleAccess(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, storetest.SQLiteDSN(t))
	mk := func(name string, kind store.AccountKind, share bool) string {
		a := store.Account{Name: name, Kind: kind, MembersShareAccess: share}
		if err := st.CreateAccount(ctx, &a); err != nil {
			t.Fatal(err)
		}
		return a.ID
	}
	alice, bob := mk("alice", store.AccountPersonal, false), mk("bob", store.AccountPersonal, false)
	carol, dave := mk("carol", store.AccountPersonal, false), mk("dave", store.AccountPersonal, false)
	acme, shared := mk("acme", store.AccountOrg, false), mk("shared", store.AccountOrg, true)
	for _, m := range [][2]string{{acme, alice}, {acme, bob}, {shared, carol}, {shared, dave}} {
		if err := st.AddOrgMember(ctx, m[0], m[1]); err != nil {
			t.Fatal(err)
		}
	}
	access := SubmoduleAccess{Auth: auth.NewAuthenticator(st), Accounts: st}
	cases := []struct {
		name              string
		account, owner    string
		mayRead, mayWrite bool
	}{
		{"own repository", alice, alice, true, true},
		// The one write rule (git push's): members read, never write.
		{"member into its organization", alice, acme, true, false},
		{"member into its sharing organization", carol, shared, true, false},
		{"organization into its member", acme, alice, true, true},
		{"members of a closed organization", alice, bob, false, false},
		{"members of a sharing organization", carol, dave, true, true},
		{"outsider into an organization", carol, acme, false, false},
		{"organization into an outsider", acme, carol, false, false},
		{"unrelated accounts", alice, carol, false, false},
		{"unknown account", uuid.NewString(), alice, false, false},
		{"unknown owner", alice, uuid.NewString(), false, false},
	}
	authn := auth.NewAuthenticator(st)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, u := range []struct {
				use  repo.Use
				want bool
			}{{repo.UseRead, tc.mayRead}, {repo.UseWrite, tc.mayWrite}} {
				got, err := access.MayUseRepository(ctx, tc.account, tc.owner, u.use)
				if err != nil || got != u.want {
					t.Fatalf("MayUseRepository(use %d) = %v, %v; want %v", u.use, got, err, u.want)
				}
			}
			// Writing follows git push exactly: MayWrite of the account's
			// own key.
			if acct, err := st.GetAccount(ctx, tc.account); err == nil {
				push, err := authn.MayWrite(ctx, auth.Principal{AccountID: acct.ID, Kind: acct.Kind}, tc.owner)
				if err != nil || push != tc.mayWrite {
					t.Fatalf("MayWrite = %v, %v; want %v", push, err, tc.mayWrite)
				}
			}
		})
	}
}
