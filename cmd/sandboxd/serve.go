package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/sandbox"
)

// `sandboxd serve` is the composition root: one setup function per
// component, each with its own flag group (serve_*.go), called in order:
//
//	storage    serve_storage.go    the data dir, the database, the blob store
//	runtime    serve_runtime.go    the base image and the sandbox backend
//	network    serve_network.go    sandbox networking (netpol)
//	cluster    serve_cluster.go    this node among others (cluster.go)
//	domain     serve_domain.go     jobs, repositories and files, forge,
//	                               persistence, the sandbox manager, the
//	                               tasks, retention
//	front ends serve_frontends.go  model proxy, MCP, E2B, the API, mounted
//	listeners  serve_listeners.go  the API, the way home, metrics, cluster
//
// Every flag is parsed and checked (serveOptions.check) before anything is
// opened or started; a value refused names its flag, and the variable it
// came from (env.go).

// serveOptions are the settings of `sandboxd serve`, a group per component.
type serveOptions struct {
	storage   storageOptions
	runtime   runtimeOptions
	network   networkOptions
	cluster   clusterOptions
	jobs      jobsOptions
	files     filesOptions
	forge     forgeOptions
	persist   persistOptions
	sandboxes sandboxOptions
	templates templatesOptions
	events    eventsOptions
	agents    agentOptions
	retention retentionOptions
	models    modelOptions
	frontEnds frontEndOptions
	listeners listenerOptions
}

// register adds every group's flags to f.
func (o *serveOptions) register(f *pflag.FlagSet) {
	o.listeners.register(f)
	o.storage.register(f)
	o.runtime.register(f)
	o.network.register(f)
	o.cluster.register(f)
	o.jobs.register(f)
	o.files.register(f)
	o.forge.register(f)
	o.persist.register(f)
	o.sandboxes.register(f)
	o.templates.register(f)
	o.events.register(f)
	o.agents.register(f)
	o.retention.register(f)
	o.models.register(f)
	o.frontEnds.register(f)
}

// check refuses the first bad value of any group, before serve opens or
// starts anything; what a check derives (absolute paths, loaded keys, the
// default public URL) it keeps in the options.
func (o *serveOptions) check(g *globals) error {
	for _, check := range []func() error{
		g.checkLogging,
		o.listeners.check,
		o.storage.check,
		o.runtime.check,
		o.network.check,
		func() error { return o.cluster.check(o.storage.blobURL) },
		o.jobs.check,
		func() error { return o.files.check(o.listeners.listen) },
		o.persist.check,
		o.sandboxes.check,
		o.agents.check,
		o.retention.check,
		o.events.check,
		o.models.check,
		o.frontEnds.check,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

func newServeCmd(g *globals) *cobra.Command {
	return serveCommand(g, &serveOptions{}, serve)
}

// serveCommand is `sandboxd serve` running run once the flags (and their
// variables) are parsed and checked: tests give a run that starts nothing.
func serveCommand(g *globals, o *serveOptions, run func(context.Context, *globals, *serveOptions) error) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the API, the job workers and the sandbox host",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.check(g); err != nil {
				return explainSource(cmd.Flags(), err)
			}
			return explainSource(cmd.Flags(), run(cmd.Context(), g, o))
		},
	}
	o.register(cmd.Flags())
	return cmd
}

// serve sets up each component in turn and runs them until ctx ends.
func serve(ctx context.Context, g *globals, o *serveOptions) error {
	log := g.logger(os.Stderr)
	// The operator's credentials are in o now; take them out of this
	// process's environment so that no child (runsc, QEMU, git, hooks)
	// inherits them.
	unsetEnv("GITHUB_TOKEN", "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "SANDBOXD_MODEL_API_KEY")
	dataDir, nodeID, err := openDataDir(g.dataDir)
	if err != nil {
		return err
	}
	log = log.With("node_id", nodeID)
	gh, err := setupForge(o.forge, log)
	if err != nil {
		return err
	}
	stor, closeStorage, err := setupStorage(ctx, g, o.storage, dataDir, nodeID, log)
	if err != nil {
		return err
	}
	defer closeStorage()
	// The store's credentials (from its URL or the environment) are held
	// by the blob store now: no child process needs them.
	unsetEnv(blob.EnvS3AccessKey, blob.EnvS3SecretKey, "SANDBOXD_BLOB_STORE")
	rt, closeRuntime, err := setupRuntime(ctx, g, o.runtime, dataDir, os.Stderr, log)
	if err != nil {
		return err
	}
	defer closeRuntime()
	nw, err := setupNetwork(ctx, o.network, dataDir, rt.rt, log)
	if err != nil {
		return err
	}
	clu, err := setupCluster(ctx, &o.cluster, stor, rt, nw, o.runtime.nodeCapacity, log)
	if err != nil {
		return err
	}
	dom, err := setupDomain(ctx, g, o, domainDeps{stor, rt, nw, clu, gh}, log)
	if err != nil {
		return err
	}
	reg := newRegistry(stor, rt, dom)
	fe, closeFrontEnds, err := setupFrontEnds(ctx, o, frontEndDeps{stor, rt, clu, dom, reg}, log)
	if err != nil {
		return err
	}
	defer closeFrontEnds()
	ls, err := setupListeners(o.listeners, stor.homeSocket(), fe, log)
	if err != nil {
		return err
	}
	n := &node{o: o, stor: stor, rt: rt, clu: clu, dom: dom, fe: fe, ls: ls, reg: reg, log: log}
	return n.run(ctx)
}

// node is this server, set up: node.run starts its work and serves it.
type node struct {
	o    *serveOptions
	stor *storage
	rt   *sandboxRuntime
	clu  *clusterParts
	dom  *domain
	fe   *frontEnds
	ls   *listeners
	reg  *prometheus.Registry
	log  *slog.Logger
}

// run starts the job workers, the manager's loops, membership and
// retention, serves every listener until ctx ends (or one fails), then
// shuts down.
func (n *node) run(ctx context.Context) error {
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	if err := n.dom.jobs.Start(runCtx); err != nil {
		return err
	}
	go func() {
		if err := n.dom.mgr.Run(runCtx); err != nil {
			n.log.Error("sandbox manager stopped", "err", err)
		}
	}()
	go func() {
		if err := n.dom.members.Run(runCtx); err != nil {
			n.log.Error("cluster membership stopped", "err", err)
		}
	}()
	// Every node sweeps: the deletes are idempotent batches, and each
	// node keeps the logs of the runs it worked.
	go n.dom.sweeper.Run(runCtx)
	// Every node collects its own cache of template images (and, with
	// the others, what no template needs in the shared store), and the
	// template builds that lost their tags.
	go n.dom.tpls.RunCollector(runCtx)
	// In a cluster, each node syncs again the volumes a failed sync left
	// on it.
	go n.dom.volumes.Run(runCtx)
	// Every node dispatches the deliveries its events made (and any node's
	// left pending), and works their jobs.
	go func() {
		if err := n.dom.hooks.Run(runCtx); err != nil {
			n.log.Error("webhook dispatcher stopped", "err", err)
		}
	}()

	n.log.Info("sandboxd serving", "addr", n.ls.ln.Addr().String(), "data_dir", n.stor.dataDir, "database", n.stor.st.Dialect(),
		"runtime", n.rt.rt.Name(), "image", n.rt.baseID, "version", version)
	errc := make(chan error, 4)
	go func() { errc <- n.ls.http.Serve(n.ls.ln) }()
	go func() { errc <- n.ls.home.Serve(n.ls.homeLn) }()
	metricsSrv, err := serveMetrics(n.o.listeners.metricsAddr, n.reg, n.log, errc)
	if err != nil {
		_ = n.ls.http.Close()
		return err
	}
	clusterSrv := n.clu.serve(n.fe.cluster, n.log, errc)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	err = n.shutdown(metricsSrv, clusterSrv)
	stopRun()
	return err
}

// shutdown stops serving, then (without --keep-sandboxes) this node's
// sandboxes, then the job workers.
func (n *node) shutdown(servers ...*http.Server) error {
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := errors.Join(n.ls.http.Shutdown(shutdownCtx), n.ls.home.Shutdown(shutdownCtx))
	for _, srv := range servers {
		if srv != nil {
			err = errors.Join(err, srv.Shutdown(shutdownCtx))
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if n.o.sandboxes.keep {
		n.log.Info("shutting down; sandboxes keep running and are re-attached at the next start")
	} else {
		n.log.Info("shutting down; stopping this node's sandboxes")
		err = errors.Join(err, n.dom.mgr.StopAll(shutdownCtx, "sandboxd shut down"))
	}
	// Running jobs get until the shutdown deadline. A run's command still
	// running then runs on in its kept sandbox (the agent owns it), and the
	// next start's reconcile follows it again; without --keep-sandboxes
	// its sandbox was stopped above and the run ended with it.
	return errors.Join(err, n.dom.jobs.Stop(shutdownCtx))
}

// openDataDir makes the data dir (absolute) and returns it with this
// node's id, kept in it.
func openDataDir(dir string) (dataDir, nodeID string, err error) {
	if dataDir, err = filepath.Abs(dir); err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", "", fmt.Errorf("create data dir: %w", err)
	}
	nodeID, err = sandbox.NodeID(dataDir)
	return dataDir, nodeID, err
}

// unsetEnv drops the variables from this process's environment.
func unsetEnv(names ...string) {
	for _, k := range names {
		_ = os.Unsetenv(k)
	}
}

// checkLogging refuses a log level or format the logger would ignore.
func (g *globals) checkLogging() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return flagErrorf("log-level", "--log-level %q: want debug, info, warn or error", g.logLevel)
	}
	if strings.EqualFold(g.logFormat, "text") || strings.EqualFold(g.logFormat, "json") {
		return nil
	}
	return flagErrorf("log-format", "--log-format %q: want text or json", g.logFormat)
}

// orNone maps a duration flag whose 0 means none onto an option whose 0
// means the default and a negative value none.
func orNone(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

func templateNames() string {
	var names string
	for i, t := range image.Templates() {
		if i > 0 {
			names += ", "
		}
		names += t.Name
	}
	return names
}

// atLeast refuses a flag's value below least; want says what it takes.
func atLeast[T cmp.Ordered](flag string, v, least T, want string) error {
	if v >= least {
		return nil
	}
	return flagErrorf(flag, "--%s %v: want %s", flag, v, want)
}

// firstError is the first of errs that is not nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
