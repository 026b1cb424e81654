package files

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/internal/auth"
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
		name           string
		account, owner string
		want           bool
	}{
		{"own repository", alice, alice, true},
		{"member into its organization", alice, acme, true},
		{"organization into its member", acme, alice, true},
		{"members of a closed organization", alice, bob, false},
		{"members of a sharing organization", carol, dave, true},
		{"outsider into an organization", carol, acme, false},
		{"organization into an outsider", acme, carol, false},
		{"unrelated accounts", alice, carol, false},
		{"unknown account", uuid.NewString(), alice, false},
		{"unknown owner", alice, uuid.NewString(), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := access.MayUseRepository(ctx, tc.account, tc.owner)
			if err != nil || got != tc.want {
				t.Fatalf("MayUseRepository = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
