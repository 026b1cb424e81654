package store

import (
	"context"
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
		locker, err := lock.NewPostgresSessionLocker()
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		opts = append(opts, goose.WithSessionLocker(locker))
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
