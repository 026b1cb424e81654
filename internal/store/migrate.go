package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"syscall"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/sandboxd/sandboxd/internal/store/migrations"
)

// migrate applies pending migrations. Several processes may open the same
// database at once (nodes sharing PostgreSQL; the admin CLI next to the
// server on SQLite), so migrations run under a lock each of them honours: a
// PostgreSQL advisory lock, or for SQLite an flock on a file beside the
// database (goose checks and applies in separate transactions, so
// IMMEDIATE transactions alone would let two processes apply one migration).
func (s *Store) migrate(ctx context.Context, sqlitePath string) error {
	opts := []goose.ProviderOption{goose.WithDisableGlobalRegistry(true)}
	var dialect goose.Dialect
	switch s.dialect {
	case DialectPostgres:
		dialect = goose.DialectPostgres
		opts = append(opts, goose.WithSessionLocker(pgAdvisoryLocker{id: migrationLockID}))
	case DialectSQLite:
		dialect = goose.DialectSQLite3
		unlock, err := flockFile(ctx, sqlitePath+"-migrate.lock")
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		defer unlock()
	}
	p, err := goose.NewProvider(dialect, s.db, migrations.FS, opts...)
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

// migrationLockID is the PostgreSQL advisory lock that serializes sandboxd's
// migrations across processes (an arbitrary constant, unique to sandboxd).
const migrationLockID int64 = 0x73616e64626f78 // "sandbox"

// pgAdvisoryLocker holds a PostgreSQL session advisory lock while goose
// migrates. goose's own locker polls with pg_try_advisory_lock every few
// seconds, so nodes starting together would wait seconds for each other;
// pg_advisory_lock waits in the server and returns as soon as the lock is
// free (or ctx ends: the driver cancels the query).
type pgAdvisoryLocker struct{ id int64 }

var _ lock.SessionLocker = pgAdvisoryLocker{}

func (l pgAdvisoryLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", l.id); err != nil {
		return fmt.Errorf("take migration lock: %w", err)
	}
	return nil
}

func (l pgAdvisoryLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", l.id); err != nil {
		return fmt.Errorf("release migration lock: %w", err)
	}
	return nil
}
