package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // registers the "sqlite" database/sql driver
)

// Dialect names, as returned by (*Store).Dialect.
const (
	DialectSQLite   = "sqlite"
	DialectPostgres = "postgres"
)

// ErrInvalid is returned when a value is rejected before or by the schema: an
// unknown status or kind, a missing required field, or an operation that does
// not apply to the row (such as adding an organization as a member).
var ErrInvalid = errors.New("invalid")

// busyTimeoutMS is how long a SQLite connection waits for another writer
// (another goroutine's transaction or another process, such as the admin CLI
// running while the server does) before giving up with SQLITE_BUSY.
const busyTimeoutMS = 10000

// Store is an open database. Its embedded Queries run outside any
// transaction; InTx runs a function inside one. A Store is safe for
// concurrent use.
type Store struct {
	*Queries

	dialect string
	db      *sql.DB // all writes (on SQLite: exactly one connection)
	rdb     *sql.DB // reads; the same as db on PostgreSQL
	logger  *slog.Logger
}

// Open connects to the database named by dsn and applies pending migrations.
//
// A dsn starting with postgres:// or postgresql:// is a PostgreSQL connection
// URL. Anything else is a SQLite database file, given as a path or as
// sqlite://path (sqlite:///abs/path for an absolute one); the file is created
// if missing, but its directory must exist.
func Open(ctx context.Context, dsn string, logger *slog.Logger) (*Store, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return openPostgres(ctx, dsn, logger)
	}
	path, err := sqlitePath(dsn)
	if err != nil {
		return nil, err
	}
	return openSQLite(ctx, path, logger)
}

func openPostgres(ctx context.Context, dsn string, logger *slog.Logger) (*Store, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	// Bounded, so that a burst queues here instead of exhausting the
	// server's max_connections (shared by every node and by River); some
	// stay warm because every API request touches the database.
	db.SetMaxOpenConns(25)
	db.SetMaxIdleConns(8)
	db.SetConnMaxIdleTime(5 * time.Minute)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to postgres %s: %w", redactURL(dsn), err)
	}
	s := newStore(DialectPostgres, db, db, logger)
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// sqlitePath extracts the file path from a SQLite dsn.
func sqlitePath(dsn string) (string, error) {
	path := dsn
	switch {
	case strings.HasPrefix(path, "sqlite://"):
		path = strings.TrimPrefix(path, "sqlite://")
	case strings.HasPrefix(path, "sqlite:"):
		path = strings.TrimPrefix(path, "sqlite:")
	}
	switch {
	case path == "":
		return "", fmt.Errorf("open sqlite: %w: empty database path", ErrInvalid)
	case strings.ContainsAny(path, "?#\x00"):
		// The driver reads everything after '?' as parameters; we own those.
		return "", fmt.Errorf("open sqlite %q: %w: path must not contain '?', '#' or NUL", path, ErrInvalid)
	case path == ":memory:" || strings.HasPrefix(path, "file:"):
		// An in-memory database is private to one connection, and Open uses
		// two pools; URI filenames would bypass the parameters set here.
		return "", fmt.Errorf("open sqlite %q: %w: want a file path", path, ErrInvalid)
	}
	return path, nil
}

func openSQLite(ctx context.Context, path string, logger *slog.Logger) (*Store, error) {
	if fi, err := os.Stat(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("open sqlite %s: %s is not a directory", path, filepath.Dir(path))
	}
	// Writes: one connection, so writers in this process queue in
	// database/sql instead of contending for SQLite's lock, and transactions
	// begin IMMEDIATE so that a transaction never has to upgrade a read lock
	// to a write lock (the one case busy_timeout cannot wait out). WAL lets
	// readers run during a write; synchronous=NORMAL is durable against
	// process crashes and loses at most the last transactions on power loss,
	// which WAL keeps consistent.
	//
	// Processes opening the same file take turns until its migrations are
	// done: switching a new database to WAL needs an exclusive lock that
	// SQLite reports as SQLITE_BUSY without waiting (busy_timeout does not
	// apply), and migrations must not run twice.
	unlock, err := flockFile(ctx, path+"-migrate.lock")
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	defer unlock()
	wparams := url.Values{}
	wparams.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS))
	wparams.Add("_pragma", "journal_mode(WAL)")
	wparams.Add("_pragma", "foreign_keys(1)")
	wparams.Add("_pragma", "synchronous(NORMAL)")
	wparams.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", path+"?"+wparams.Encode())
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}

	s := newStore(DialectSQLite, db, nil, logger)
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}

	// Reads: a pool of read-only connections. query_only turns a write that
	// slipped onto this pool into an error instead of a lock fight.
	rparams := url.Values{}
	rparams.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", busyTimeoutMS))
	rparams.Add("_pragma", "foreign_keys(1)")
	rparams.Add("_pragma", "query_only(1)")
	rdb, err := sql.Open("sqlite", path+"?"+rparams.Encode())
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s for reading: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	rdb.SetMaxOpenConns(n)
	rdb.SetMaxIdleConns(n)
	if err := rdb.PingContext(ctx); err != nil {
		rdb.Close()
		db.Close()
		return nil, fmt.Errorf("open sqlite %s for reading: %w", path, err)
	}
	s.rdb = rdb
	s.Queries.rdb = rdb
	return s, nil
}

func newStore(dialect string, db, rdb *sql.DB, logger *slog.Logger) *Store {
	if rdb == nil {
		rdb = db // until the SQLite read pool exists (migrations only write)
	}
	return &Store{
		Queries: &Queries{dialect: dialect, db: db, rdb: rdb},
		dialect: dialect,
		db:      db,
		rdb:     rdb,
		logger:  logger,
	}
}

// Dialect reports which database this is: DialectSQLite or DialectPostgres.
func (s *Store) Dialect() string { return s.dialect }

// DB returns the database handle through which all writes go. On SQLite it
// holds a single connection: a caller holding a transaction on it must not
// wait for another use of it.
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the database. Queries in flight fail.
func (s *Store) Close() error {
	var err error
	if s.rdb != s.db {
		err = s.rdb.Close()
	}
	return errors.Join(err, s.db.Close())
}

// InTx runs fn in a transaction: it commits when fn returns nil and rolls
// back when fn returns an error or panics. fn must do all its work through q
// (or tx): on SQLite the transaction holds the only write connection, so a
// write through the Store from inside fn would wait forever.
func (s *Store) InTx(ctx context.Context, fn func(tx *sql.Tx, q *Queries) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			// The error that made us roll back is the one worth reporting.
			_ = tx.Rollback()
		}
	}()
	if err := fn(tx, s.Queries.withTx(tx)); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit transaction: %w", mapErr(err))
	}
	committed = true
	return nil
}

// redactURL hides the password of a connection URL for error messages.
func redactURL(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
