package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
)

// serveOptions are the settings of `sandboxd serve`.
type serveOptions struct {
	listen      string
	snapshotTTL time.Duration
}

func newServeCmd(g *globals) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the API, the job workers and the sandbox host",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), g, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", envOr("SANDBOXD_LISTEN", "127.0.0.1:8080"), "address to serve the API on (env SANDBOXD_LISTEN)")
	f.DurationVar(&o.snapshotTTL, "snapshot-ttl", envDuration("SANDBOXD_SNAPSHOT_TTL", 7*24*time.Hour), "how long an account's snapshot row stays valid (env SANDBOXD_SNAPSHOT_TTL)")
	return cmd
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := os.Getenv(name); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}

func serve(ctx context.Context, g *globals, o *serveOptions) error {
	log := g.logger(os.Stderr)
	st, err := g.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv, err := api.New(api.Options{
		Store:       st,
		Auth:        auth.NewAuthenticator(st),
		Logger:      log,
		Registry:    reg,
		Version:     version,
		SnapshotTTL: o.snapshotTTL,
	})
	if err != nil {
		return fmt.Errorf("build API: %w", err)
	}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	httpSrv := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("sandboxd serving", "addr", ln.Addr().String(), "data_dir", g.dataDir, "database", st.Dialect(), "version", version)

	errc := make(chan error, 1)
	go func() { errc <- httpSrv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := httpSrv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down HTTP server: %w", err)
	}
	return nil
}
