package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Queries carries every query of the store, bound either to the database
// (Store.Queries) or to one transaction (the q InTx passes to its function).
type Queries struct {
	dialect string
	db      *sql.DB // writes and transactions; nil when bound to tx
	rdb     *sql.DB // reads outside a transaction
	tx      *sql.Tx
}

func (q *Queries) withTx(tx *sql.Tx) *Queries {
	return &Queries{dialect: q.dialect, tx: tx}
}

// rebind rewrites the '?' placeholders of query to the dialect's. Queries in
// this package never contain '?' except as placeholders.
func rebind(dialect, query string) string {
	if dialect != DialectPostgres || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

func (q *Queries) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	query = rebind(q.dialect, query)
	if q.tx != nil {
		return q.tx.ExecContext(ctx, query, args...)
	}
	return q.db.ExecContext(ctx, query, args...)
}

// execCount runs a write and returns how many rows it changed.
func (q *Queries) execCount(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q *Queries) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	query = rebind(q.dialect, query)
	if q.tx != nil {
		return q.tx.QueryContext(ctx, query, args...)
	}
	return q.rdb.QueryContext(ctx, query, args...)
}

func (q *Queries) queryRow(ctx context.Context, query string, args ...any) *sql.Row {
	query = rebind(q.dialect, query)
	if q.tx != nil {
		return q.tx.QueryRowContext(ctx, query, args...)
	}
	return q.rdb.QueryRowContext(ctx, query, args...)
}

// writeQueryRow runs a write that returns a row (RETURNING).
func (q *Queries) writeQueryRow(ctx context.Context, query string, args ...any) *sql.Row {
	query = rebind(q.dialect, query)
	if q.tx != nil {
		return q.tx.QueryRowContext(ctx, query, args...)
	}
	return q.db.QueryRowContext(ctx, query, args...)
}

// atomically runs fn in a transaction: q's own when q is bound to one, else
// a new one that commits when fn returns nil.
func (q *Queries) atomically(ctx context.Context, fn func(q *Queries) error) error {
	if q.tx != nil {
		return fn(q)
	}
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if err := fn(q.withTx(tx)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit transaction: %w", mapErr(err))
	}
	return nil
}

// exists reports whether table has a row whose column equals value, so that
// a write that matched no row can tell "absent" from "not in that state".
func (q *Queries) exists(ctx context.Context, table, column, value string) (bool, error) {
	var one int
	err := q.queryRow(ctx, "SELECT 1 FROM "+table+" WHERE "+column+" = ?", value).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, nil
}

// Kinds of constraint violation, told apart across both drivers.
type violation int

const (
	noViolation violation = iota
	uniqueViolation
	foreignKeyViolation
	checkViolation
	notNullViolation
)

func classify(err error) violation {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505":
			return uniqueViolation
		case "23503":
			return foreignKeyViolation
		case "23514":
			return checkViolation
		case "23502":
			return notNullViolation
		}
		return noViolation
	}
	var liteErr *sqlite.Error
	if errors.As(err, &liteErr) {
		switch liteErr.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return uniqueViolation
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return foreignKeyViolation
		case sqlite3.SQLITE_CONSTRAINT_CHECK:
			return checkViolation
		case sqlite3.SQLITE_CONSTRAINT_NOTNULL:
			return notNullViolation
		}
	}
	return noViolation
}

// mapErr turns driver errors into the package's sentinels for an insert or
// update: a unique violation is ErrConflict, a foreign key violation means a
// referenced row is missing (ErrNotFound), and a check or not-null violation
// is ErrInvalid. The driver's error stays in the chain.
func mapErr(err error) error {
	switch classify(err) {
	case uniqueViolation:
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case foreignKeyViolation:
		return fmt.Errorf("%w: referenced row: %w", ErrNotFound, err)
	case checkViolation, notNullViolation:
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return err
}

// mapDeleteErr is mapErr for deletes, where a foreign key violation means
// the row is still referenced (ErrConflict).
func mapDeleteErr(err error) error {
	if classify(err) == foreignKeyViolation {
		return fmt.Errorf("%w: still referenced: %w", ErrConflict, err)
	}
	return mapErr(err)
}

// notFound maps sql.ErrNoRows to ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// Times are stored as unix milliseconds. The zero time maps to its own
// millisecond value and back, so it round-trips exactly.

// zeroMillis is time.Time{}.UnixMilli().
var zeroMillis = time.Time{}.UnixMilli()

// ms normalizes t to what the database keeps: UTC, milliseconds.
func ms(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC().Truncate(time.Millisecond)
}

func toMillis(t time.Time) int64 { return t.UnixMilli() }

func fromMillis(v int64) time.Time {
	if v == zeroMillis {
		return time.Time{}
	}
	return time.UnixMilli(v).UTC()
}

// msPtr normalizes an optional time in place.
func msPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	v := ms(*t)
	return &v
}

// nullMillis is the column value of an optional time.
func nullMillis(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixMilli()
}

func fromNullMillis(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromMillis(v.Int64)
	return &t
}

// nullString stores "" as NULL, for optional references.
func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// nowMS is the current time as the database keeps it.
func nowMS() time.Time { return ms(time.Now()) }

// inList returns "?, ?, ..." for n values and the values as arguments.
func inList[T ~string](values []T) (string, []any) {
	args := make([]any, len(values))
	for i, v := range values {
		args[i] = string(v)
	}
	return strings.TrimSuffix(strings.Repeat("?, ", len(values)), ", "), args
}

// scanner is what *sql.Row and *sql.Rows have in common.
type scanner interface {
	Scan(dest ...any) error
}

// queryAll runs a query on q and scans every row it returns with scan.
func queryAll[T any](ctx context.Context, q *Queries, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{} // empty, not nil: lists encode as [] in JSON
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
