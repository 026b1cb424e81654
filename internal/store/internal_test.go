package store

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRebind(t *testing.T) {
	tests := []struct {
		dialect, in, want string
	}{
		{DialectPostgres, "SELECT 1", "SELECT 1"},
		{DialectPostgres, "a = ? AND b IN (?, ?)", "a = $1 AND b IN ($2, $3)"},
		{DialectPostgres, "?????????????", "$1$2$3$4$5$6$7$8$9$10$11$12$13"},
		{DialectSQLite, "a = ? AND b = ?", "a = ? AND b = ?"},
	}
	for _, tt := range tests {
		if got := rebind(tt.dialect, tt.in); got != tt.want {
			t.Errorf("rebind(%s, %q) = %q, want %q", tt.dialect, tt.in, got, tt.want)
		}
	}
}

func TestSQLitePath(t *testing.T) {
	tests := []struct {
		dsn, want string
		wantErr   bool
	}{
		{"/var/lib/sandboxd/db.sqlite", "/var/lib/sandboxd/db.sqlite", false},
		{"rel/db", "rel/db", false},
		{"sqlite:///abs/db", "/abs/db", false},
		{"sqlite://rel/db", "rel/db", false},
		{"sqlite:rel/db", "rel/db", false},
		{"", "", true},
		{"sqlite://", "", true},
		{"db?x=1", "", true},
		{"db#frag", "", true},
		{"db\x00", "", true},
		{":memory:", "", true},
		{"sqlite://:memory:", "", true},
		{"file:db", "", true},
	}
	for _, tt := range tests {
		got, err := sqlitePath(tt.dsn)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("sqlitePath(%q) = %q, %v; want %q, error %v", tt.dsn, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("sqlitePath(%q) error %v is not ErrInvalid", tt.dsn, err)
		}
	}
}

func TestMillis(t *testing.T) {
	tests := []time.Time{
		{},
		time.Unix(0, 0),
		time.Unix(-1, 999_999_999),
		time.Date(2025, 3, 14, 15, 9, 26, 535_000_000, time.UTC),
		time.Date(1, 1, 1, 0, 0, 0, 1_000_000, time.UTC),
	}
	for _, in := range tests {
		got := fromMillis(toMillis(ms(in)))
		if got != ms(in) {
			t.Errorf("round trip of %v = %v, want %v", in, got, ms(in))
		}
	}
	if !fromMillis(toMillis(time.Time{})).IsZero() {
		t.Error("zero time does not round-trip to the zero time")
	}
}

func TestMapErr(t *testing.T) {
	other := errors.New("other")
	tests := []struct {
		in         error
		want       error
		wantDelete error
	}{
		{&pgconn.PgError{Code: "23505"}, ErrConflict, ErrConflict},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "23503"}), ErrNotFound, ErrConflict},
		{&pgconn.PgError{Code: "23514"}, ErrInvalid, ErrInvalid},
		{&pgconn.PgError{Code: "23502"}, ErrInvalid, ErrInvalid},
		{&pgconn.PgError{Code: "42P01"}, nil, nil},
		{other, nil, nil},
	}
	for _, tt := range tests {
		for _, c := range []struct {
			got, want error
		}{{mapErr(tt.in), tt.want}, {mapDeleteErr(tt.in), tt.wantDelete}} {
			if tt.want == nil {
				if c.got != tt.in {
					t.Errorf("mapping %v changed it to %v", tt.in, c.got)
				}
				continue
			}
			if !errors.Is(c.got, c.want) || !errors.Is(c.got, tt.in) {
				t.Errorf("mapped %v to %v; want it to wrap %v and the original", tt.in, c.got, c.want)
			}
		}
	}
}
