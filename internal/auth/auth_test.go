package auth

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
	"github.com/sandboxd/sandboxd/internal/store/storetest"
)

func TestMain(m *testing.M) { storetest.Main(m) }

func TestKeyFromHeaders(t *testing.T) {
	cases := []struct {
		name    string
		headers map[string]string
		repeat  []string // headers sent twice more: once as given, once different
		want    string
		err     error
	}{
		{"x-api-key twice, same", map[string]string{"x-api-key": "k1"}, []string{"x-api-key=k1"}, "", ErrCredentials},
		{"x-api-key twice, different", map[string]string{"x-api-key": "k1"}, []string{"x-api-key=k2"}, "", ErrCredentials},
		{"Authorization twice", map[string]string{"Authorization": "Bearer k1"}, []string{"Authorization=Bearer k2"}, "", ErrCredentials},
		{"x-api-key twice, first empty", map[string]string{"x-api-key": ""}, []string{"x-api-key=k2"}, "", ErrCredentials},
		{"none", nil, nil, "", ErrCredentials},
		{"both", map[string]string{"x-api-key": "a", "Authorization": "Bearer b"}, nil, "", ErrCredentials},
		{"x-api-key", map[string]string{"x-api-key": " k1 "}, nil, "k1", nil},
		{"bearer", map[string]string{"Authorization": "Bearer k2"}, nil, "k2", nil},
		{"bearer lowercase", map[string]string{"Authorization": "bearer k3"}, nil, "k3", nil},
		{"basic", map[string]string{"Authorization": "Basic abc"}, nil, "", ErrUnauthorized},
		{"bearer empty", map[string]string{"Authorization": "Bearer"}, nil, "", ErrUnauthorized},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.headers {
				h.Set(k, v)
			}
			for _, kv := range tc.repeat {
				k, v, _ := strings.Cut(kv, "=")
				h.Add(k, v)
			}
			got, err := KeyFromHeaders(h)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestNewKey(t *testing.T) {
	k1, p1, h1, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	k2, _, h2, _ := NewKey()
	if k1 == k2 || h1 == h2 {
		t.Fatal("keys repeat")
	}
	if !strings.HasPrefix(k1, KeyPrefix) || !strings.HasPrefix(k1, p1) || len(k1) < 50 {
		t.Fatalf("key %q prefix %q", k1, p1)
	}
	if HashKey(k1) != h1 || len(h1) != 64 || strings.Contains(h1, k1) {
		t.Fatalf("hash %q", h1)
	}
}

// TestAccess covers the one access rule on both databases: personal keys,
// organization keys, members, non-members, shared organizations, sandbox
// keys, and revoked or expired keys.
func TestAccess(t *testing.T) {
	storetest.Dialects(t, func(t *testing.T, dsn string) {
		ctx := context.Background()
		st := storetest.Open(t, dsn)
		mk := func(name string, kind store.AccountKind) store.Account {
			a := store.Account{Name: name, Kind: kind}
			if err := st.CreateAccount(ctx, &a); err != nil {
				t.Fatal(err)
			}
			return a
		}
		alice, bob, carol, dave := mk("alice", store.AccountPersonal), mk("bob", store.AccountPersonal), mk("carol", store.AccountPersonal), mk("dave", store.AccountPersonal)
		org, shared := mk("acme", store.AccountOrg), mk("shared", store.AccountOrg)
		for _, m := range [][2]string{{org.ID, alice.ID}, {org.ID, bob.ID}, {shared.ID, carol.ID}, {shared.ID, dave.ID}} {
			if err := st.AddOrgMember(ctx, m[0], m[1]); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.SetMembersShareAccess(ctx, shared.ID, true); err != nil {
			t.Fatal(err)
		}
		sb := store.Sandbox{ID: "sbx_1", AccountID: carol.ID, NodeID: "node", Status: store.SandboxRunning, Runtime: "gvisor", Deadline: time.Now().Add(time.Hour)}
		if err := st.CreateSandbox(ctx, &sb); err != nil {
			t.Fatal(err)
		}
		a := NewAuthenticator(st)
		key := func(account string, mutate func(*store.APIKey)) string {
			plaintext, prefix, hash, err := NewKey()
			if err != nil {
				t.Fatal(err)
			}
			k := store.APIKey{AccountID: account, Prefix: prefix, Hash: hash}
			if mutate != nil {
				mutate(&k)
			}
			if err := st.CreateAPIKey(ctx, &k); err != nil {
				t.Fatal(err)
			}
			return plaintext
		}
		past := time.Now().Add(-time.Hour)
		future := time.Now().Add(time.Hour)
		revokedKey := key(alice.ID, nil)
		keys, _ := st.ListAPIKeys(ctx, alice.ID)
		if err := st.RevokeAPIKey(ctx, keys[0].ID, time.Now()); err != nil {
			t.Fatal(err)
		}

		cases := []struct {
			name    string
			key     string
			target  string
			authErr error
			want    bool
		}{
			{"personal key, own account", key(alice.ID, nil), alice.ID, nil, true},
			{"personal key, org co-member without sharing", key(alice.ID, nil), bob.ID, nil, false},
			{"personal key, stranger", key(alice.ID, nil), carol.ID, nil, false},
			{"personal key, its organization", key(alice.ID, nil), org.ID, nil, false},
			{"personal key, sharing organization", key(carol.ID, nil), dave.ID, nil, true},
			{"org key, itself", key(org.ID, nil), org.ID, nil, true},
			{"org key, member", key(org.ID, nil), alice.ID, nil, true},
			{"org key, non-member", key(org.ID, nil), carol.ID, nil, false},
			{"org key, other organization", key(org.ID, nil), shared.ID, nil, false},
			{"sandbox key, own account", key(carol.ID, func(k *store.APIKey) { k.SandboxID = "sbx_1" }), carol.ID, nil, true},
			{"sandbox key, sharing member", key(carol.ID, func(k *store.APIKey) { k.SandboxID = "sbx_1" }), dave.ID, nil, false},
			{"unexpired key", key(alice.ID, func(k *store.APIKey) { k.ExpiresAt = &future }), alice.ID, nil, true},
			{"expired key", key(alice.ID, func(k *store.APIKey) { k.ExpiresAt = &past }), alice.ID, ErrUnauthorized, false},
			{"revoked key", revokedKey, alice.ID, ErrUnauthorized, false},
			{"unknown key", "sbx_unknown", alice.ID, ErrUnauthorized, false},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				p, err := a.Authenticate(ctx, tc.key)
				if !errors.Is(err, tc.authErr) {
					t.Fatalf("Authenticate: %v, want %v", err, tc.authErr)
				}
				if err != nil {
					return
				}
				got, err := a.MayActFor(ctx, p, tc.target)
				if err != nil || got != tc.want {
					t.Fatalf("MayActFor = %v, %v; want %v", got, err, tc.want)
				}
				resolved, err := a.ResolveAccount(ctx, p, tc.target)
				if tc.want && (err != nil || resolved != tc.target) {
					t.Fatalf("ResolveAccount = %q, %v", resolved, err)
				}
				if !tc.want && !errors.Is(err, ErrForbidden) {
					t.Fatalf("ResolveAccount err = %v, want ErrForbidden", err)
				}
			})
		}

		t.Run("read", func(t *testing.T) {
			reads := []struct {
				name   string
				key    string
				target string
				want   bool
			}{
				{"member reads its organization", key(alice.ID, nil), org.ID, true},
				{"member's sandbox reads its organization", key(carol.ID, func(k *store.APIKey) { k.SandboxID = "sbx_1" }), shared.ID, true},
				{"stranger reads an organization", key(carol.ID, nil), org.ID, false},
				{"member reads a co-member", key(alice.ID, nil), bob.ID, false},
				{"own account", key(bob.ID, nil), bob.ID, true},
			}
			for _, tc := range reads {
				p, err := a.Authenticate(ctx, tc.key)
				if err != nil {
					t.Fatal(err)
				}
				if got, err := a.MayRead(ctx, p, tc.target); err != nil || got != tc.want {
					t.Errorf("%s: MayRead = %v, %v; want %v", tc.name, got, err, tc.want)
				}
			}
		})

		// SandboxFor is the same rule applied to a sandbox by id: sbx_1
		// is carol's, so exactly the keys that may act for carol see it,
		// and every other answer is not found, as an id that does not
		// exist (ids cannot be probed).
		t.Run("sandbox by id", func(t *testing.T) {
			sandboxKey := key(carol.ID, func(k *store.APIKey) { k.SandboxID = "sbx_1" })
			sees := []struct {
				name, key, account string
				want               error
			}{
				{"owner", key(carol.ID, nil), "", nil},
				{"owner naming itself", key(carol.ID, nil), carol.ID, nil},
				{"owner's sandbox key", sandboxKey, "", nil},
				{"member of a sharing organization", key(dave.ID, nil), "", nil},
				{"sharing member naming the owner", key(dave.ID, nil), carol.ID, nil},
				{"sharing member naming itself", key(dave.ID, nil), dave.ID, errdefs.ErrNotFound},
				{"stranger", key(alice.ID, nil), "", errdefs.ErrNotFound},
				{"stranger naming the owner", key(alice.ID, nil), carol.ID, ErrForbidden},
				{"other organization's key", key(org.ID, nil), "", errdefs.ErrNotFound},
				{"bad account_id", key(carol.ID, nil), "not-a-uuid", ErrInvalidAccountID},
			}
			for _, tc := range sees {
				p, err := a.Authenticate(ctx, tc.key)
				if err != nil {
					t.Fatal(err)
				}
				got, err := a.SandboxFor(ctx, p, "sbx_1", tc.account)
				if !errors.Is(err, tc.want) || (err == nil && got.ID != "sbx_1") {
					t.Errorf("%s: SandboxFor = %q, %v; want %v", tc.name, got.ID, err, tc.want)
				}
				if tc.want == errdefs.ErrNotFound && errdefs.Message(err, "") != "Sandbox not found" {
					t.Errorf("%s: message %q, want the same as for a missing sandbox", tc.name, errdefs.Message(err, ""))
				}
			}
			p, _ := a.Authenticate(ctx, key(carol.ID, nil))
			if _, err := a.SandboxFor(ctx, p, "sbx_missing", ""); !errors.Is(err, errdefs.ErrNotFound) || errdefs.Message(err, "") != "Sandbox not found" {
				t.Errorf("missing sandbox: %v", err)
			}

			// A run is held to the same rule (Owns): seen by the keys
			// that may act for its account, else hidden as a missing one.
			run := store.Run{AccountID: carol.ID, Task: "run-sandbox-command", Status: store.RunQueued, Payload: []byte("{}")}
			if err := st.CreateRun(ctx, &run); err != nil {
				t.Fatal(err)
			}
			for _, tc := range sees {
				p, _ := a.Authenticate(ctx, tc.key)
				if got, err := a.RunFor(ctx, p, run.ID, tc.account); !errors.Is(err, tc.want) || (err == nil && got.ID != run.ID) {
					t.Errorf("%s: RunFor = %q, %v; want %v", tc.name, got.ID, err, tc.want)
				}
			}
			if _, err := a.RunFor(ctx, p, "run_missing", ""); errdefs.Message(err, "") != "Task run not found" {
				t.Errorf("missing run: %v", err)
			}
		})

		t.Run("resolve defaults and bad ids", func(t *testing.T) {
			p, err := a.Authenticate(ctx, key(alice.ID, nil))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := a.ResolveAccount(ctx, p, ""); err != nil || got != alice.ID {
				t.Fatalf("default account: %q %v", got, err)
			}
			if _, err := a.ResolveAccount(ctx, p, "not-a-uuid"); !errors.Is(err, ErrInvalidAccountID) {
				t.Fatalf("bad id: %v", err)
			}
			if got, err := a.ResolveAccount(ctx, p, strings.ToUpper(alice.ID)); err != nil || got != alice.ID {
				t.Fatalf("upper-case id: %q %v", got, err)
			}
		})
	})
}

func TestMayCall(t *testing.T) {
	full := Principal{KeyID: "k", AccountID: "a"}
	sandbox := Principal{KeyID: "k", AccountID: "a", SandboxID: "sbx_1"}
	cases := []struct {
		p      Principal
		method string
		ok     bool
	}{
		{full, http.MethodPost, true},
		{full, http.MethodDelete, true},
		{sandbox, http.MethodGet, true},
		{sandbox, http.MethodHead, true},
		{sandbox, http.MethodPost, false},
		{sandbox, http.MethodPatch, false},
		{sandbox, http.MethodDelete, false},
		{sandbox, http.MethodPut, false},
		{sandbox, "PROPFIND", false},
	}
	for _, tc := range cases {
		err := tc.p.MayCall(tc.method)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrScope)) {
			t.Errorf("scope %v %s: %v, want ok=%v", tc.p.Scope(), tc.method, err, tc.ok)
		}
	}
}
