package store_test

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestSlugify(t *testing.T) {
	tests := []struct{ name, want string }{
		{"Hello World", "hello-world"},
		{"  Acme, Inc.  ", "acme-inc"},
		{"already-a-slug", "already-a-slug"},
		{"UPPER_case__name", "upper-case-name"},
		{"Café Zoë 2", "caf-zo-2"},
		{"日本語", "account"},
		{"", "account"},
		{"---", "account"},
		{strings.Repeat("ab", 100), strings.Repeat("ab", 24)},
	}
	for _, tt := range tests {
		if got := store.Slugify(tt.name); got != tt.want {
			t.Errorf("Slugify(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestCreateAccount(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		fixed := store.Account{ID: "11111111-1111-4111-8111-111111111111", Name: "Fixed", Slug: "fixed", CreatedAt: t0}
		if err := s.CreateAccount(t.Context(), &fixed); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name     string
			in       *store.Account
			wantSlug string
			wantKind store.AccountKind
			wantErr  error
		}{
			{"slug from name", &store.Account{Name: "Hello World"}, "hello-world", store.AccountPersonal, nil},
			{"same name gets suffix", &store.Account{Name: "hello world!"}, "hello-world-2", store.AccountPersonal, nil},
			{"third gets next suffix", &store.Account{Name: "Hello  World"}, "hello-world-3", store.AccountPersonal, nil},
			{"org", &store.Account{Name: "Acme", Kind: store.AccountOrg, MembersShareAccess: true}, "acme", store.AccountOrg, nil},
			{"name without letters", &store.Account{Name: "!!!"}, "account", store.AccountPersonal, nil},
			{"explicit slug", &store.Account{Name: "X", Slug: "custom-slug"}, "custom-slug", store.AccountPersonal, nil},
			{"explicit slug taken", &store.Account{Name: "Y", Slug: "custom-slug"}, "", "", store.ErrConflict},
			{"generated slug next to explicit one", &store.Account{Name: "Fixed"}, "fixed-2", store.AccountPersonal, nil},
			{"id taken", &store.Account{ID: fixed.ID, Name: "Other"}, "", "", store.ErrConflict},
			{"id taken with slug", &store.Account{ID: fixed.ID, Name: "Other", Slug: "other"}, "", "", store.ErrConflict},
			{"bad kind", &store.Account{Name: "Z", Kind: "team"}, "", "", store.ErrInvalid},
			{"nil", nil, "", "", store.ErrInvalid},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := s.CreateAccount(t.Context(), tt.in)
				wantErr(t, "CreateAccount", err, tt.wantErr)
				if tt.wantErr != nil {
					return
				}
				if tt.in.Slug != tt.wantSlug || tt.in.Kind != tt.wantKind || tt.in.ID == "" || tt.in.CreatedAt.IsZero() {
					t.Fatalf("created %+v, want slug %q kind %q and ID, CreatedAt filled", tt.in, tt.wantSlug, tt.wantKind)
				}
				got, err := s.GetAccount(t.Context(), tt.in.ID)
				if err != nil {
					t.Fatal(err)
				}
				if got != *tt.in {
					t.Fatalf("GetAccount = %+v, want %+v", got, *tt.in)
				}
			})
		}

		got, err := s.GetAccount(t.Context(), fixed.ID)
		if err != nil || got.CreatedAt != t0ms || got.CreatedAt.Location().String() != "UTC" {
			t.Fatalf("GetAccount(fixed) = %+v, %v; want CreatedAt %v UTC", got, err, t0ms)
		}
		_, err = s.GetAccount(t.Context(), "no-such-account")
		wantErr(t, "GetAccount(missing)", err, store.ErrNotFound)

		all, err := s.ListAccounts(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 8 || all[0].ID != fixed.ID {
			t.Fatalf("ListAccounts = %d accounts starting %+v; want 8, oldest (fixed) first", len(all), all[0])
		}
	})
}

func TestOrgMembership(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		ctx := t.Context()
		org := mustAccountAt(t, s, store.AccountOrg, "Org", t0)
		org2 := mustAccountAt(t, s, store.AccountOrg, "Org Two", t0.Add(time.Second))
		alice := mustAccountAt(t, s, store.AccountPersonal, "Alice", t0.Add(2*time.Second))
		bob := mustAccountAt(t, s, store.AccountPersonal, "Bob", t0.Add(3*time.Second))
		carol := mustAccountAt(t, s, store.AccountPersonal, "Carol", t0.Add(4*time.Second))

		adds := []struct {
			name         string
			org, account string
			want         error
		}{
			{"alice to org", org.ID, alice.ID, nil},
			{"alice again", org.ID, alice.ID, nil},
			{"bob to org", org.ID, bob.ID, nil},
			{"alice to org2", org2.ID, alice.ID, nil},
			{"carol to org2", org2.ID, carol.ID, nil},
			{"org into org", org.ID, org2.ID, store.ErrInvalid},
			{"into a personal account", alice.ID, bob.ID, store.ErrInvalid},
			{"missing org", "missing", alice.ID, store.ErrNotFound},
			{"missing member", org.ID, "missing", store.ErrNotFound},
		}
		for _, tt := range adds {
			wantErr(t, "AddOrgMember "+tt.name, s.AddOrgMember(ctx, tt.org, tt.account), tt.want)
		}

		members := []struct {
			org, account string
			want         bool
		}{
			{org.ID, alice.ID, true}, {org.ID, bob.ID, true}, {org.ID, carol.ID, false},
			{org2.ID, alice.ID, true}, {org2.ID, carol.ID, true}, {org2.ID, bob.ID, false},
			{"missing", alice.ID, false},
		}
		for _, tt := range members {
			got, err := s.IsOrgMember(ctx, tt.org, tt.account)
			if err != nil || got != tt.want {
				t.Errorf("IsOrgMember(%s, %s) = %v, %v; want %v", tt.org, tt.account, got, err, tt.want)
			}
		}

		orgs, err := s.ListOrgsOf(ctx, alice.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(orgs, func(a store.Account) string { return a.ID }); !slices.Equal(got, []string{org.ID, org2.ID}) {
			t.Errorf("ListOrgsOf(alice) = %v, want [org org2]", got)
		}
		ms, err := s.ListMembers(ctx, org.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got := ids(ms, func(a store.Account) string { return a.ID }); !slices.Equal(got, []string{alice.ID, bob.ID}) {
			t.Errorf("ListMembers(org) = %v, want [alice bob]", got)
		}

		shares := func(a, b string, want bool) {
			t.Helper()
			got, err := s.SharesOrgWithAccess(ctx, a, b)
			if err != nil || got != want {
				t.Errorf("SharesOrgWithAccess(%s, %s) = %v, %v; want %v", a, b, got, err, want)
			}
		}
		shares(alice.ID, bob.ID, false) // org does not share access yet
		wantErr(t, "SetMembersShareAccess(org)", s.SetMembersShareAccess(ctx, org.ID, true), nil)
		got, err := s.GetAccount(ctx, org.ID)
		if err != nil || !got.MembersShareAccess {
			t.Fatalf("after SetMembersShareAccess: %+v, %v", got, err)
		}
		shares(alice.ID, bob.ID, true)
		shares(bob.ID, alice.ID, true)
		shares(alice.ID, carol.ID, false) // org2 does not share
		shares(bob.ID, carol.ID, false)   // no common org
		wantErr(t, "SetMembersShareAccess(org2)", s.SetMembersShareAccess(ctx, org2.ID, true), nil)
		shares(alice.ID, carol.ID, true)
		shares(bob.ID, carol.ID, false)
		wantErr(t, "SetMembersShareAccess(personal)", s.SetMembersShareAccess(ctx, alice.ID, true), store.ErrInvalid)
		wantErr(t, "SetMembersShareAccess(missing)", s.SetMembersShareAccess(ctx, "missing", true), store.ErrNotFound)

		wantErr(t, "RemoveOrgMember", s.RemoveOrgMember(ctx, org.ID, bob.ID), nil)
		wantErr(t, "RemoveOrgMember again", s.RemoveOrgMember(ctx, org.ID, bob.ID), store.ErrNotFound)
		shares(alice.ID, bob.ID, false)
		if ok, err := s.IsOrgMember(ctx, org.ID, bob.ID); ok || err != nil {
			t.Errorf("IsOrgMember after removal = %v, %v", ok, err)
		}
		wantErr(t, "SetMembersShareAccess(off)", s.SetMembersShareAccess(ctx, org2.ID, false), nil)
		shares(alice.ID, carol.ID, false)
	})
}

// TestCreateAccountConcurrentSlugs creates accounts with one name at once:
// each must get its own slug, none an error.
func TestCreateAccountConcurrentSlugs(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		s := storetest.Open(t, dsn)
		const n = 10
		slugs := make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				a := store.Account{Name: "Same Name"}
				if err := s.CreateAccount(t.Context(), &a); err != nil {
					t.Errorf("CreateAccount %d: %v", i, err)
				}
				slugs[i] = a.Slug
			})
		}
		wg.Wait()
		slices.Sort(slugs)
		want := []string{"same-name"}
		for i := 2; i <= n; i++ {
			want = append(want, "same-name-"+strconv.Itoa(i))
		}
		slices.Sort(want)
		if !slices.Equal(slugs, want) {
			t.Errorf("slugs = %v, want %v", slugs, want)
		}
	})
}
