// Package storetest gives tests a real database of each dialect the store
// supports: a SQLite file in the test's temporary directory, and a fresh
// PostgreSQL database created for the test and dropped after it.
//
// PostgreSQL comes from, in order: the server named by SANDBOXD_TEST_POSTGRES
// (a postgres:// URL whose user may CREATE DATABASE); else a throwaway
// cluster this package starts once per test process from Debian's
// postgresql-15 binaries; else nowhere, and the PostgreSQL half of a test is
// skipped — or fails, when SANDBOXD_REQUIRE_POSTGRES=1 (as in CI).
//
// The throwaway cluster lives in a temporary directory and is stopped and
// removed when the test process exits, however it exits: a supervising shell
// receives the parent-death signal. Packages that call Main from TestMain
// also stop it synchronously before the process ends.
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/sandboxd/sandboxd/internal/store"
)

// Environment variables that choose where PostgreSQL tests run.
const (
	// EnvPostgres names a PostgreSQL server (postgres:// URL) to create test
	// databases on.
	EnvPostgres = "SANDBOXD_TEST_POSTGRES"
	// EnvRequirePostgres, set to 1, makes a missing PostgreSQL a test
	// failure instead of a skip.
	EnvRequirePostgres = "SANDBOXD_REQUIRE_POSTGRES"
)

// Dialects runs fn once per dialect, as the subtests "sqlite" and
// "postgres", each with the DSN of a fresh, empty database.
func Dialects(t *testing.T, fn func(t *testing.T, dsn string)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) {
		fn(t, SQLiteDSN(t))
	})
	t.Run("postgres", func(t *testing.T) {
		fn(t, PostgresDSN(t))
	})
}

// SQLiteDSN returns the path of a SQLite database file (not yet created) in
// the test's temporary directory.
func SQLiteDSN(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "sandboxd.db")
}

// PostgresDSN creates a PostgreSQL database for the test, drops it when the
// test ends, and returns its URL. Without a PostgreSQL server it skips the
// test, or fails it when SANDBOXD_REQUIRE_POSTGRES=1.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	server, err := postgresServer()
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	if server == "" {
		msg := "storetest: no PostgreSQL: set " + EnvPostgres + " to a postgres:// URL or install postgresql-15 (" + initdbPath + ")"
		if os.Getenv(EnvRequirePostgres) == "1" {
			t.Fatal(msg + "; " + EnvRequirePostgres + "=1 makes this a failure")
		}
		t.Skip(msg)
	}
	dsn, drop, err := createDatabase(server)
	if err != nil {
		t.Fatalf("storetest: %v", err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Errorf("storetest: %v", err)
		}
	})
	return dsn
}

// Open opens the store at dsn (applying migrations) and closes it when the
// test ends. Its log goes to the test's output.
func Open(t testing.TB, dsn string) *store.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := store.Open(ctx, dsn, logger)
	if err != nil {
		t.Fatalf("storetest: open store: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("storetest: close store: %v", err)
		}
	})
	return s
}

// Main runs the tests of a package and then stops the throwaway PostgreSQL
// cluster, if one was started. Call it from TestMain:
//
//	func TestMain(m *testing.M) { storetest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	stopCluster()
	os.Exit(code)
}

// createDatabase creates a database with a random name on the server at
// serverURL and returns its URL and the function that drops it.
func createDatabase(serverURL string) (dsn string, drop func() error, err error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", nil, fmt.Errorf("parse %s: %w", EnvPostgres, err)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, err
	}
	name := "sandboxd_test_" + hex.EncodeToString(b[:])

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := sql.Open("pgx", serverURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to %s: %w", u.Redacted(), err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("create database %s on %s: %w", name, u.Redacted(), err)
	}

	du := *u
	du.Path = "/" + name
	drop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := sql.Open("pgx", serverURL)
		if err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		defer admin.Close()
		// FORCE ends sessions a test left open (PostgreSQL 13 and later).
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	return du.String(), drop, nil
}
