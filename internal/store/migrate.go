package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"syscall"

	"github.com/pressly/goose/v3"

	"github.com/sandboxd/sandboxd/internal/store/migrations"
)

// migrate applies pending migrations. Several processes may open the same
// database at once (nodes sharing PostgreSQL; the admin CLI next to the
// server on SQLite), so the whole of it runs under a lock each of them
// honours: a PostgreSQL advisory lock, or for SQLite an flock on a file
// beside the database (which openSQLite takes before its first connection). goose's own session locker would not do: it covers
// applying migrations but not goose's first look at its version table, so
// processes racing on a new database retry for a second or more, and it
// polls for the lock every five seconds.
func (s *Store) migrate(ctx context.Context) error {
	var dialect goose.Dialect
	switch s.dialect {
	case DialectPostgres:
		dialect = goose.DialectPostgres
		unlock, err := pgAdvisoryLock(ctx, s.db, migrationLockID)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		defer unlock()
	case DialectSQLite:
		// openSQLite holds the file lock that serializes migrations.
		dialect = goose.DialectSQLite3
	}
	p, err := goose.NewProvider(dialect, s.db, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	results, err := p.Up(ctx)
	for _, r := range results {
		if r.Error == nil {
			s.logger.Info("applied migration", "file", r.Source.Path, "version", r.Source.Version, "duration", r.Duration)
		}
	}
	if err != nil {
		return fmt.Errorf("migrate %s database: %w", s.dialect, err)
	}
	return nil
}

// migrationLockID is the PostgreSQL advisory lock that serializes sandboxd's
// migrations across processes (an arbitrary constant, unique to sandboxd).
const migrationLockID int64 = 0x73616e64626f78 // "sandbox"

// pgAdvisoryLock takes a session advisory lock on a connection of its own
// and returns the function that releases it. pg_advisory_lock waits in the
// server and returns as soon as the lock is free, or fails when ctx ends
// (the driver cancels the query).
func pgAdvisoryLock(ctx context.Context, db *sql.DB, id int64) (unlock func(), err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("take advisory lock: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", id); err != nil {
		conn.Close()
		return nil, fmt.Errorf("take advisory lock: %w", err)
	}
	return func() {
		// Closing the session would release the lock too, but the pool
		// keeps sessions open: release it explicitly, even if ctx ended.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", id)
		conn.Close()
	}, nil
}

// flockFile takes an exclusive flock on path, creating the file if needed,
// and returns the function that releases it. It gives up when ctx ends.
func flockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		// Closing the file releases the lock.
		return func() { f.Close() }, nil
	case <-ctx.Done():
		// The goroutine still waits for the lock; close the file once it
		// gets it (or fails), which releases it again.
		go func() {
			<-done
			f.Close()
		}()
		return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
	}
}
