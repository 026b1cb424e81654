package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

const accountCols = "id, name, slug, kind, members_share_access, created_at"

func scanAccount(s scanner) (Account, error) {
	var a Account
	var kind string
	var created int64
	if err := s.Scan(&a.ID, &a.Name, &a.Slug, &kind, &a.MembersShareAccess, &created); err != nil {
		return Account{}, err
	}
	a.Kind = AccountKind(kind)
	a.CreatedAt = fromMillis(created)
	return a, nil
}

// maxSlugBase bounds the part of a generated slug taken from the name, so
// that slugs stay usable in URLs and repository names.
const maxSlugBase = 48

// Slugify derives a slug from a name: lowercase ASCII letters and digits,
// with every other run of characters turned into one '-', and no leading or
// trailing '-'. A name with no letters or digits gives "account".
func Slugify(name string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			if b.Len() >= maxSlugBase {
				break
			}
			continue
		}
		dash = true
	}
	if b.Len() == 0 {
		return "account"
	}
	return b.String()
}

// CreateAccount inserts a. It fills an empty ID with a random UUID, an empty
// Kind with AccountPersonal, a zero CreatedAt with now, and an empty Slug
// with Slugify(Name), suffixed "-2", "-3", ... until unique. A given Slug or
// ID that is taken is ErrConflict.
func (q *Queries) CreateAccount(ctx context.Context, a *Account) error {
	if a == nil {
		return fmt.Errorf("create account: %w: nil account", ErrInvalid)
	}
	if a.Kind == "" {
		a.Kind = AccountPersonal
	}
	if a.Kind != AccountPersonal && a.Kind != AccountOrg {
		return fmt.Errorf("create account: %w: kind %q", ErrInvalid, a.Kind)
	}
	if a.ID == "" {
		a.ID = uuid.NewString()
	}
	if a.CreatedAt.IsZero() {
		a.CreatedAt = nowMS()
	}
	a.CreatedAt = ms(a.CreatedAt)

	const insert = "INSERT INTO accounts (" + accountCols + ") VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
	insertAs := func(slug string) (bool, error) {
		n, err := q.execCount(ctx, insert, a.ID, a.Name, slug, string(a.Kind), a.MembersShareAccess, toMillis(a.CreatedAt))
		if err != nil {
			return false, fmt.Errorf("create account %s: %w", a.ID, mapErr(err))
		}
		return n == 1, nil
	}

	if a.Slug != "" {
		ok, err := insertAs(a.Slug)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("create account %s (slug %q): %w", a.ID, a.Slug, ErrConflict)
		}
		return nil
	}

	base := Slugify(a.Name)
	// Another writer may take the slug we picked between our look and our
	// insert (on PostgreSQL; SQLite writers are serialized); look again.
	for attempt := 0; attempt < 50; attempt++ {
		slug, err := q.freeSlug(ctx, base)
		if err != nil {
			return fmt.Errorf("create account %s: %w", a.ID, err)
		}
		ok, err := insertAs(slug)
		if err != nil {
			return err
		}
		if ok {
			a.Slug = slug
			return nil
		}
		taken, err := q.exists(ctx, "accounts", "id", a.ID)
		if err != nil {
			return fmt.Errorf("create account %s: %w", a.ID, err)
		}
		if taken {
			return fmt.Errorf("create account %s: %w", a.ID, ErrConflict)
		}
	}
	return fmt.Errorf("create account %s: %w: no free slug for %q", a.ID, ErrConflict, base)
}

// freeSlug returns base if no account has it, else base-N for the smallest
// free N >= 2.
func (q *Queries) freeSlug(ctx context.Context, base string) (string, error) {
	taken, err := queryAll(ctx, q, func(s scanner) (string, error) {
		var slug string
		err := s.Scan(&slug)
		return slug, err
	}, "SELECT slug FROM accounts WHERE slug = ? OR slug LIKE ?", base, base+"-%")
	if err != nil {
		return "", fmt.Errorf("look up slugs like %q: %w", base, err)
	}
	used := make(map[string]bool, len(taken))
	for _, s := range taken {
		used[s] = true
	}
	if !used[base] {
		return base, nil
	}
	for n := 2; ; n++ {
		if s := base + "-" + strconv.Itoa(n); !used[s] {
			return s, nil
		}
	}
}

// GetAccount returns the account with the given id.
func (q *Queries) GetAccount(ctx context.Context, id string) (Account, error) {
	a, err := scanAccount(q.queryRow(ctx, "SELECT "+accountCols+" FROM accounts WHERE id = ?", id))
	if err != nil {
		return Account{}, fmt.Errorf("get account %s: %w", id, notFound(err))
	}
	return a, nil
}

// ListAccounts returns every account, oldest first.
func (q *Queries) ListAccounts(ctx context.Context) ([]Account, error) {
	out, err := queryAll(ctx, q, scanAccount, "SELECT "+accountCols+" FROM accounts ORDER BY created_at, id")
	if err != nil {
		return nil, fmt.Errorf("list accounts: %w", err)
	}
	return out, nil
}

// AddOrgMember makes the personal account accountID a member of the
// organization orgID. Adding a member twice is not an error. Either account
// missing is ErrNotFound; orgID not an organization or accountID not a
// personal account is ErrInvalid.
func (q *Queries) AddOrgMember(ctx context.Context, orgID, accountID string) error {
	org, err := q.GetAccount(ctx, orgID)
	if err != nil {
		return fmt.Errorf("add member %s to org: %w", accountID, err)
	}
	if org.Kind != AccountOrg {
		return fmt.Errorf("add member %s to %s: %w: not an organization", accountID, orgID, ErrInvalid)
	}
	acct, err := q.GetAccount(ctx, accountID)
	if err != nil {
		return fmt.Errorf("add member to org %s: %w", orgID, err)
	}
	if acct.Kind != AccountPersonal {
		return fmt.Errorf("add member %s to %s: %w: not a personal account", accountID, orgID, ErrInvalid)
	}
	_, err = q.exec(ctx, "INSERT INTO org_members (org_id, account_id, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
		orgID, accountID, toMillis(nowMS()))
	if err != nil {
		return fmt.Errorf("add member %s to %s: %w", accountID, orgID, mapErr(err))
	}
	return nil
}

// RemoveOrgMember removes accountID from the organization orgID; it is
// ErrNotFound when accountID is not a member.
func (q *Queries) RemoveOrgMember(ctx context.Context, orgID, accountID string) error {
	n, err := q.execCount(ctx, "DELETE FROM org_members WHERE org_id = ? AND account_id = ?", orgID, accountID)
	if err != nil {
		return fmt.Errorf("remove member %s from %s: %w", accountID, orgID, err)
	}
	if n == 0 {
		return fmt.Errorf("remove member %s from %s: %w", accountID, orgID, ErrNotFound)
	}
	return nil
}

// IsOrgMember reports whether accountID is a member of the organization orgID.
func (q *Queries) IsOrgMember(ctx context.Context, orgID, accountID string) (bool, error) {
	var n int
	err := q.queryRow(ctx, "SELECT COUNT(*) FROM org_members WHERE org_id = ? AND account_id = ?", orgID, accountID).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("check membership of %s in %s: %w", accountID, orgID, err)
	}
	return n > 0, nil
}

// SharesOrgWithAccess reports whether a and b are both members of some
// organization whose members share access.
func (q *Queries) SharesOrgWithAccess(ctx context.Context, a, b string) (bool, error) {
	var n int
	err := q.queryRow(ctx, `SELECT COUNT(*) FROM org_members ma
		JOIN org_members mb ON mb.org_id = ma.org_id
		JOIN accounts o ON o.id = ma.org_id
		WHERE ma.account_id = ? AND mb.account_id = ? AND o.members_share_access = ?`, a, b, true).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("check shared organizations of %s and %s: %w", a, b, err)
	}
	return n > 0, nil
}

// ListOrgsOf returns the organizations accountID is a member of, oldest first.
func (q *Queries) ListOrgsOf(ctx context.Context, accountID string) ([]Account, error) {
	out, err := queryAll(ctx, q, scanAccount, `SELECT `+prefixCols("o", accountCols)+` FROM accounts o
		JOIN org_members m ON m.org_id = o.id
		WHERE m.account_id = ? ORDER BY o.created_at, o.id`, accountID)
	if err != nil {
		return nil, fmt.Errorf("list organizations of %s: %w", accountID, err)
	}
	return out, nil
}

// ListMembers returns the members of the organization orgID, oldest first.
func (q *Queries) ListMembers(ctx context.Context, orgID string) ([]Account, error) {
	out, err := queryAll(ctx, q, scanAccount, `SELECT `+prefixCols("a", accountCols)+` FROM accounts a
		JOIN org_members m ON m.account_id = a.id
		WHERE m.org_id = ? ORDER BY a.created_at, a.id`, orgID)
	if err != nil {
		return nil, fmt.Errorf("list members of %s: %w", orgID, err)
	}
	return out, nil
}

// SetMembersShareAccess sets whether the members of the organization orgID
// may act for one another. It is ErrInvalid for a personal account.
func (q *Queries) SetMembersShareAccess(ctx context.Context, orgID string, share bool) error {
	n, err := q.execCount(ctx, "UPDATE accounts SET members_share_access = ? WHERE id = ? AND kind = ?", share, orgID, string(AccountOrg))
	if err != nil {
		return fmt.Errorf("set members_share_access of %s: %w", orgID, err)
	}
	if n == 0 {
		ok, err := q.exists(ctx, "accounts", "id", orgID)
		if err != nil {
			return fmt.Errorf("set members_share_access of %s: %w", orgID, err)
		}
		if ok {
			return fmt.Errorf("set members_share_access of %s: %w: not an organization", orgID, ErrInvalid)
		}
		return fmt.Errorf("set members_share_access of %s: %w", orgID, ErrNotFound)
	}
	return nil
}

// prefixCols qualifies each column of a comma-separated list with alias.
func prefixCols(alias, cols string) string {
	parts := strings.Split(cols, ", ")
	for i, p := range parts {
		parts[i] = alias + "." + p
	}
	return strings.Join(parts, ", ")
}
