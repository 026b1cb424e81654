// Package auth owns API keys and the one rule of who may act for whom.
//
// A key is a random secret with a visible prefix ("sbx_" + 12 characters) so
// operators can tell keys apart in listings; only its SHA-256 is stored. A
// request authenticates with exactly one of the x-api-key header or an
// Authorization: Bearer header. Everything that acts for an account asks
// MayActFor; nothing else decides access.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// KeyPrefix starts every key so that leaked keys are easy to recognise
// (secret scanners, logs) and easy to tell apart from other credentials.
const KeyPrefix = "sbx_"

// visiblePrefixLen is how much of a key is stored in clear to identify it.
const visiblePrefixLen = len(KeyPrefix) + 8

var (
	// ErrCredentials means neither or both credential headers were sent.
	ErrCredentials = errors.New("exactly one of x-api-key or Authorization must be provided")
	// ErrUnauthorized means the key is unknown, expired or revoked.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrInvalidAccountID means account_id is not a UUID.
	ErrInvalidAccountID = errors.New("account_id must be a valid UUID")
	// ErrForbidden means the key may not act for the requested account.
	ErrForbidden = errors.New("access denied to specified account_id")
	// ErrScope means the key is valid but its scope does not cover the
	// request (a sandbox key asking to change something).
	ErrScope = errors.New("this key may not do this")
)

// Scope is what a key may do for its account.
type Scope int

const (
	// ScopeFull keys (made by an operator with `admin key create`) may do
	// everything their account may.
	ScopeFull Scope = iota
	// ScopeSandbox keys are minted for one sandbox and handed to the code
	// inside it, which is untrusted: they may read their own account's
	// API routes, read and write its repository through the git server,
	// and use the model proxy. They may not change the account's
	// environment, start sandboxes or runs, upload, or extend any
	// sandbox's lifetime — so code inside cannot outlive what it was
	// given.
	ScopeSandbox
)

// Scope is the principal's scope, derived from the key: keys minted for a
// sandbox are sandbox-scoped.
func (p Principal) Scope() Scope {
	if p.SandboxID != "" {
		return ScopeSandbox
	}
	return ScopeFull
}

// MayCall answers whether the principal's scope covers an API request with
// the given method. Sandbox keys read (GET, HEAD); everything that changes
// state or starts work is refused with an error saying so. The git server
// and the model proxy are not API routes: they apply their own rules
// (account repository access, sandbox keys only).
func (p Principal) MayCall(method string) error {
	if p.Scope() == ScopeFull {
		return nil
	}
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	return fmt.Errorf("%w: a sandbox's key (RECOUP_API_KEY) may only read the API (GET), use the git server and the model proxy; %s needs an account key", ErrScope, method)
}

// NewKey returns a fresh plaintext key, the prefix stored in clear, and the
// hex SHA-256 stored in the database. 32 random bytes make the hash safe
// without a slow KDF: there is nothing to brute-force.
func NewKey() (plaintext, prefix, hash string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", "", fmt.Errorf("generate key: %w", err)
	}
	body := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
	plaintext = KeyPrefix + body
	return plaintext, plaintext[:visiblePrefixLen], HashKey(plaintext), nil
}

// E2BKeyPrefix starts the keys minted in E2B's form: some of E2B's SDKs
// (JavaScript 2.27 to 2.45) refuse a key that is not "e2b_" and hex.
const E2BKeyPrefix = "e2b_"

// NewE2BKey is NewKey in E2B's form, "e2b_" and 64 hex digits (32 random
// bytes, as NewKey). It authenticates like any key: only its look differs.
func NewE2BKey() (plaintext, prefix, hash string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", "", fmt.Errorf("generate key: %w", err)
	}
	plaintext = E2BKeyPrefix + hex.EncodeToString(b[:])
	return plaintext, plaintext[:len(E2BKeyPrefix)+8], HashKey(plaintext), nil
}

// HashKey is the stored form of a plaintext key.
func HashKey(plaintext string) string {
	sum := sha256.Sum256([]byte(plaintext))
	return hex.EncodeToString(sum[:])
}

// Principal is the authenticated caller: a key and the account it belongs to.
type Principal struct {
	KeyID     string
	AccountID string
	Kind      store.AccountKind
	// SandboxID is set for keys minted for one sandbox; such keys act only
	// for their own account.
	SandboxID string
}

// Store is what auth needs from the database.
type Store interface {
	GetAPIKeyByHash(ctx context.Context, hashHex string) (store.APIKey, error)
	GetAPIKey(ctx context.Context, id string) (store.APIKey, error)
	GetAccount(ctx context.Context, id string) (store.Account, error)
	IsOrgMember(ctx context.Context, orgID, accountID string) (bool, error)
	SharesOrgWithAccess(ctx context.Context, a, b string) (bool, error)
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	GetRun(ctx context.Context, id string) (store.Run, error)
}

// Authenticator turns request credentials into a Principal.
type Authenticator struct {
	store Store
	now   func() time.Time
}

// NewAuthenticator returns an Authenticator backed by st.
func NewAuthenticator(st Store) *Authenticator {
	return &Authenticator{store: st, now: time.Now}
}

// KeyFromHeaders extracts the credential: exactly one of x-api-key or
// Authorization: Bearer must be present, once. A repeated header is refused
// like two different ones: otherwise one layer (a proxy, a log) may act on
// the first value while another acts on the last.
func KeyFromHeaders(h http.Header) (string, error) {
	if len(h.Values("x-api-key")) > 1 || len(h.Values("Authorization")) > 1 {
		return "", ErrCredentials
	}
	apiKey := strings.TrimSpace(h.Get("x-api-key"))
	authz := strings.TrimSpace(h.Get("Authorization"))
	switch {
	case apiKey != "" && authz != "", apiKey == "" && authz == "":
		return "", ErrCredentials
	case apiKey != "":
		return apiKey, nil
	}
	scheme, token, ok := strings.Cut(authz, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", ErrUnauthorized
	}
	return strings.TrimSpace(token), nil
}

// Authenticate checks a plaintext key and returns its Principal.
func (a *Authenticator) Authenticate(ctx context.Context, plaintext string) (Principal, error) {
	key, err := a.store.GetAPIKeyByHash(ctx, HashKey(plaintext))
	return a.principalOf(ctx, key, err)
}

// AuthenticateKeyID returns the Principal of the key whose id is keyID,
// checked as Authenticate checks a key (revoked, expired, its account
// gone): for a request another node of the cluster authenticated and
// forwarded, naming the key by its id instead of carrying it.
func (a *Authenticator) AuthenticateKeyID(ctx context.Context, keyID string) (Principal, error) {
	key, err := a.store.GetAPIKey(ctx, keyID)
	return a.principalOf(ctx, key, err)
}

// principalOf checks a key looked up (err: how the lookup failed) and
// returns its Principal.
func (a *Authenticator) principalOf(ctx context.Context, key store.APIKey, err error) (Principal, error) {
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, ErrUnauthorized
	}
	if err != nil {
		return Principal{}, fmt.Errorf("look up key: %w", err)
	}
	now := a.now()
	if key.RevokedAt != nil || (key.ExpiresAt != nil && !now.Before(*key.ExpiresAt)) {
		return Principal{}, ErrUnauthorized
	}
	acct, err := a.store.GetAccount(ctx, key.AccountID)
	if errors.Is(err, store.ErrNotFound) {
		return Principal{}, ErrUnauthorized
	}
	if err != nil {
		return Principal{}, fmt.Errorf("look up account of key %s: %w", key.ID, err)
	}
	return Principal{KeyID: key.ID, AccountID: acct.ID, Kind: acct.Kind, SandboxID: key.SandboxID}, nil
}

// MayActFor answers the one access question of the service: may the caller
// act for account target? Always for its own account; for an organization
// key, for the organization's members; for a personal key, for accounts that
// share an organization with it when that organization allows it. Keys
// minted for a sandbox never reach beyond their own account.
func (a *Authenticator) MayActFor(ctx context.Context, p Principal, target string) (bool, error) {
	if target == p.AccountID {
		return true, nil
	}
	if p.SandboxID != "" {
		return false, nil
	}
	if p.Kind == store.AccountOrg {
		ok, err := a.store.IsOrgMember(ctx, p.AccountID, target)
		if err != nil {
			return false, fmt.Errorf("check membership of %s in %s: %w", target, p.AccountID, err)
		}
		return ok, nil
	}
	ok, err := a.store.SharesOrgWithAccess(ctx, p.AccountID, target)
	if err != nil {
		return false, fmt.Errorf("check shared organization of %s and %s: %w", p.AccountID, target, err)
	}
	return ok, nil
}

// MayWrite answers the one write rule of the service: may the caller write
// what account target owns (push to its repository, commit an upload into
// it, directly or through a submodule)? Exactly when it may act for
// target. In particular an organization's members, who may read its
// repository (MayRead), never write it: every member's workspace resets to
// that repository, so a write there would reach them all. The git server
// and the file service both ask this, nothing else.
func (a *Authenticator) MayWrite(ctx context.Context, p Principal, target string) (bool, error) {
	return a.MayActFor(ctx, p, target)
}

// MayRead answers whether the caller may read (never change) what account
// target owns: everything it may act for, and the organizations its account
// is a member of — so a member's sandbox can fetch the organization's
// repository as a submodule.
func (a *Authenticator) MayRead(ctx context.Context, p Principal, target string) (bool, error) {
	ok, err := a.MayActFor(ctx, p, target)
	if err != nil || ok {
		return ok, err
	}
	member, err := a.store.IsOrgMember(ctx, target, p.AccountID)
	if err != nil {
		return false, fmt.Errorf("check membership of %s in %s: %w", p.AccountID, target, err)
	}
	return member, nil
}

// ResolveAccount returns the account a request acts for: the key's own when
// requested is empty, otherwise requested if the key may act for it.
func (a *Authenticator) ResolveAccount(ctx context.Context, p Principal, requested string) (string, error) {
	if requested == "" {
		return p.AccountID, nil
	}
	if !IsUUID(requested) {
		return "", ErrInvalidAccountID
	}
	requested = strings.ToLower(requested)
	ok, err := a.MayActFor(ctx, p, requested)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", ErrForbidden
	}
	return requested, nil
}

// SandboxFor loads sandbox id for p under the one access rule (Owns). A
// sandbox that does not exist and one p may not see are the same
// errdefs.ErrNotFound, "Sandbox not found", so that ids cannot be probed.
// Every front end and every domain entry point that acts on a sandbox by id
// asks this.
func (a *Authenticator) SandboxFor(ctx context.Context, p Principal, id, account string) (store.Sandbox, error) {
	notFound := errdefs.New(errdefs.ErrNotFound, "Sandbox not found")
	sb, err := a.store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Sandbox{}, notFound
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	if err := a.Owns(ctx, p, sb.AccountID, account, notFound); err != nil {
		return store.Sandbox{}, err
	}
	return sb, nil
}

// RunFor loads task run id for p under the same rule as SandboxFor; what
// p may not see is errdefs.ErrNotFound, "Task run not found".
func (a *Authenticator) RunFor(ctx context.Context, p Principal, id, account string) (store.Run, error) {
	notFound := errdefs.New(errdefs.ErrNotFound, "Task run not found")
	run, err := a.store.GetRun(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Run{}, notFound
	}
	if err != nil {
		return store.Run{}, fmt.Errorf("get run %s: %w", id, err)
	}
	if err := a.Owns(ctx, p, run.AccountID, account, notFound); err != nil {
		return store.Run{}, err
	}
	return run, nil
}

// Owns is the one access rule applied to a thing owner's account holds:
// with account (a requested account_id) the thing must be that account's,
// and p must be allowed to act for it (ResolveAccount's errors otherwise);
// without, p must be allowed to act for owner (MayActFor). A thing p may
// not see is hidden, the error of a thing that does not exist.
func (a *Authenticator) Owns(ctx context.Context, p Principal, owner, account string, hidden error) error {
	if account != "" {
		resolved, err := a.ResolveAccount(ctx, p, account)
		if err != nil {
			return err
		}
		if owner != resolved {
			return hidden
		}
		return nil
	}
	ok, err := a.MayActFor(ctx, p, owner)
	if err != nil {
		return err
	}
	if !ok {
		return hidden
	}
	return nil
}

// IsUUID reports whether s is a UUID in its canonical 36-character form.
func IsUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	_, err := uuid.Parse(s)
	return err == nil
}
