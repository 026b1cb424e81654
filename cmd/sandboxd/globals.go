package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/store"
)

// globals are the settings every subcommand shares: where the data lives and
// how to log. Each flag falls back to its SANDBOXD_* environment variable
// (env.go).
type globals struct {
	dataDir   string
	database  string
	cacheDir  string
	logFormat string
	logLevel  string

	// waitQuiet replaces apiWaitQuiet in tests.
	waitQuiet time.Duration
}

func (g *globals) register(root *cobra.Command) {
	f := root.PersistentFlags()
	f.StringVar(&g.dataDir, "data-dir", "./data", "directory for the database, repositories, snapshots and sandboxes (env SANDBOXD_DATA_DIR)")
	f.StringVar(&g.database, "database", "", "database URL: empty for SQLite in the data dir, or postgres://... (env SANDBOXD_DATABASE)")
	f.StringVar(&g.cacheDir, "cache-dir", defaultCacheDir(), "cache for built images and kernels, shared by all data dirs (env SANDBOXD_CACHE_DIR)")
	f.StringVar(&g.logFormat, "log-format", "text", "log format: text or json (env SANDBOXD_LOG_FORMAT)")
	f.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error (env SANDBOXD_LOG_LEVEL)")
}

// logger builds the process logger from the flags.
func (g *globals) logger(w io.Writer) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(g.logFormat, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func defaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "sandboxd")
	}
	return filepath.Join(os.TempDir(), "sandboxd-cache")
}

// databaseDSN is the database to open: --database, or SQLite in the data dir.
func (g *globals) databaseDSN() (string, error) {
	if g.database != "" {
		return g.database, nil
	}
	if err := os.MkdirAll(g.dataDir, 0o700); err != nil {
		return "", fmt.Errorf("create data dir %s: %w", g.dataDir, err)
	}
	return filepath.Join(g.dataDir, "sandboxd.db"), nil
}

// openStore opens (and migrates) the database.
func (g *globals) openStore(ctx context.Context) (*store.Store, error) {
	dsn, err := g.databaseDSN()
	if err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, dsn, g.logger(os.Stderr))
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return st, nil
}

// withStore adapts a command that needs the database: it opens the store
// for the command and closes it after.
func (g *globals) withStore(run func(cmd *cobra.Command, args []string, st *store.Store) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		st, err := g.openStore(cmd.Context())
		if err != nil {
			return err
		}
		defer st.Close()
		return run(cmd, args, st)
	}
}
