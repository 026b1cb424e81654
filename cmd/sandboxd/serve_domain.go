package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"time"

	"github.com/riverqueue/river"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/agents"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/membership"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/retention"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/templates"
	"github.com/sandboxd/sandboxd/internal/volumes"
	"github.com/sandboxd/sandboxd/internal/webhooks"
)

// The domain: the job queue, repositories and files, persistence, the
// sandbox manager, the tasks (setup, coding agent) and retention, each
// with its flag group and its setup function, and setupDomain, which
// builds them in order. Nothing here is set after it is built: what one
// needs of another is given to its constructor.

// domain is what the front ends serve.
type domain struct {
	jobs    *jobs.Client
	authn   *auth.Authenticator
	repos   *repo.Manager
	files   *files.Service
	persist *persist.Service
	mgr     *sandbox.Manager
	members *membership.Membership
	agents  *agents.Service
	sweeper *retention.Sweeper
	tpls    *templates.Service
	catalog *templates.Catalog // what sandboxes start from
	hooks   *webhooks.Service  // lifecycle events and webhooks
	volumes *volumes.Service   // the accounts' volumes
}

// domainDeps are the components the domain is built on.
type domainDeps struct {
	stor  *storage
	rt    *sandboxRuntime
	nw    *network
	clu   *clusterParts
	forge *forgeParts
}

// setupDomain builds the domain, registers its job workers, re-attaches
// this node's sandboxes and starts ahead what the last process had.
func setupDomain(ctx context.Context, g *globals, o *serveOptions, d domainDeps, log *slog.Logger) (*domain, error) {
	dom := &domain{authn: auth.NewAuthenticator(d.stor.st)}
	// River's workers are a registry the job client reads when it starts:
	// the manager and the tasks fill it below, before that.
	workers := river.NewWorkers()
	var err error
	if dom.jobs, err = setupJobs(ctx, g, o.jobs, d.stor, workers, log); err != nil {
		return nil, err
	}
	if dom.repos, dom.files, err = setupFiles(o.files, &o.cluster, d.stor, dom.authn, log); err != nil {
		return nil, err
	}
	if dom.persist, err = setupPersistence(o.persist, o.runtime.diskMiB, d, dom.repos, log); err != nil {
		return nil, err
	}
	if dom.catalog, err = templates.NewCatalog(d.stor.st, templatesDir(d.stor), d.stor.blobs, templates.WithLogger(log.With("component", "templates"))); err != nil {
		return nil, err
	}
	// Templates saved from sandboxes on the built-in image stand on it.
	builtin := templates.Builtin{ID: d.rt.baseID, Dir: d.rt.baseDir}
	dom.catalog.SetBuiltin(builtin)
	// The setup runs: the manager starts an account's first, the tasks
	// run them through the manager.
	setups := agents.NewSetups(d.stor.st, dom.jobs)
	if dom.volumes, err = setupVolumes(o, d, log); err != nil {
		return nil, err
	}
	dom.mgr = setupManager(o, d, dom, setups, log)
	// Templates build through the manager (their steps' sandboxes).
	if dom.tpls, err = setupTemplates(o.templates, d.stor, dom.jobs, dom.mgr, builtin, workers, o.cluster.secret, log); err != nil {
		return nil, err
	}
	// A pause of a sandbox's files alone saves them as templates do.
	dom.mgr.SetFilesSaver(dom.tpls)
	key, err := serverKey(d.stor, o.cluster.secret)
	if err != nil {
		return nil, err
	}
	if dom.hooks, err = setupWebhooks(o.events, d.stor, dom.jobs, workers, key, log); err != nil {
		return nil, err
	}
	// This node among the others: registered, alive, watching them.
	dom.members = membership.New(membership.Config{Store: d.stor.st, NodeID: d.stor.nodeID, Node: d.clu.node, DownAfter: d.clu.downAfter,
		Sandboxes: dom.mgr, Jobs: dom.jobs, Builds: dom.tpls, Logger: log.With("component", "membership")})
	dom.agents = agents.New(agents.Config{
		Store: d.stor.st, Jobs: dom.jobs, Lifecycle: dom.mgr, Node: dom.members, Persist: dom.persist, Setups: setups, Forge: d.forge.gh,
		PublicURL: o.files.publicURL, Network: d.nw.policy, AgentRunsPerAccount: o.agents.runs,
		Logger: log.With("component", "agents"),
	})
	dom.mgr.RegisterWorkers(workers)
	dom.agents.Register(workers)
	if err := dom.mgr.Reconcile(ctx); err != nil {
		return nil, fmt.Errorf("reconcile sandboxes: %w", err)
	}
	// What was started ahead went with the last process: start it again
	// for the accounts most likely to come back first.
	dom.mgr.PrewarmRecent(ctx, o.runtime.prewarm)
	// The builds this node had not finished start again.
	if err := dom.tpls.Resume(ctx); err != nil {
		log.Warn("resume template builds", "err", err)
	}
	if dom.sweeper, err = setupRetention(o.retention, d.stor, log); err != nil {
		return nil, err
	}
	return dom, nil
}

// jobsOptions are the flags of the job queue.
type jobsOptions struct {
	concurrency, perAccount int
}

func (o *jobsOptions) register(f *pflag.FlagSet) {
	f.IntVar(&o.concurrency, "job-concurrency", 32, "jobs run at once per queue on this node")
	f.IntVar(&o.perAccount, "job-concurrency-per-account", 8, "jobs of one account run at once on this node, over all queues (the rest wait while other accounts' jobs run); 0 unlimited")
}

func (o *jobsOptions) check() error {
	return firstError(
		atLeast("job-concurrency", o.concurrency, 1, "1 or more"),
		atLeast("job-concurrency-per-account", o.perAccount, 0, "0 (unlimited) or more"),
	)
}

// setupJobs builds the job client on the database, with the workers of
// workers; it starts with the node (node.run).
func setupJobs(ctx context.Context, g *globals, o jobsOptions, stor *storage, workers *river.Workers, log *slog.Logger) (*jobs.Client, error) {
	return jobs.New(ctx, stor.st, jobs.Config{
		NodeID: stor.nodeID, Workers: workers, Concurrency: o.concurrency, PerAccount: o.perAccount,
		PostgresDSN: g.database, Logger: log.With("component", "jobs"),
	})
}

// filesOptions are the flags of the accounts' repositories and of the
// files put into them.
type filesOptions struct {
	publicURL    string
	allowPrivate bool
	limits       repoFlags
}

func (o *filesOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.publicURL, "public-url", "", "base URL clients reach this server at, used in repository URLs (default http://LISTEN)")
	f.BoolVar(&o.allowPrivate, "allow-private-downloads", false, "let file uploads download from private, loopback and link-local addresses (never metadata addresses)")
	f.Int64Var(&o.limits.fileReadMiB, "max-file-read-mib", repo.DefaultMaxReadBytes>>20, "largest file GET /api/sandboxes/file returns, in MiB (413 beyond, checked from the object's size before reading); 0 unlimited")
	f.IntVar(&o.limits.treeEntries, "filetree-max-entries", repo.DefaultTreeMaxEntries, "entries of the file tree GET /api/sandboxes lists (also cut at 4 MiB of paths; filetree_truncated says so); 0 unlimited")
	f.Int64Var(&o.limits.accountRepoMiB, "account-repo-mib", repo.DefaultQuotaBytes>>20, "disk space one account's git repository may take, in MiB: pushes past it are refused by a pre-receive hook, uploads with 429; 0 unlimited")
	f.Int64Var(&o.limits.pushMiB, "max-push-mib", repo.DefaultMaxPushBytes>>20, "largest pack one git push may send, in MiB (receive.maxInputSize; never more than --account-repo-mib); 0 unlimited")
	f.Int64Var(&o.limits.pushObjects, "max-push-objects", repo.DefaultMaxPushObjects, "most objects one git push may send; 0 unlimited")
}

// check refuses a public URL clients could not use and negative limits;
// without --public-url, it is http:// and --listen.
func (o *filesOptions) check(listen string) error {
	if o.publicURL == "" {
		o.publicURL = "http://" + listen
	} else if u, err := url.Parse(o.publicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return flagErrorf("public-url", "--public-url %q: want an http:// or https:// URL", o.publicURL)
	}
	const unlimited = "0 (unlimited) or more"
	return firstError(
		atLeast("max-file-read-mib", o.limits.fileReadMiB, 0, unlimited),
		atLeast("filetree-max-entries", o.limits.treeEntries, 0, unlimited),
		atLeast("account-repo-mib", o.limits.accountRepoMiB, 0, unlimited),
		atLeast("max-push-mib", o.limits.pushMiB, 0, unlimited),
		atLeast("max-push-objects", o.limits.pushObjects, 0, unlimited),
	)
}

// repoFlags are the bounds of the repositories (0 in a flag: unlimited).
type repoFlags struct {
	fileReadMiB, accountRepoMiB, pushMiB, pushObjects int64
	treeEntries                                       int
}

// limits converts the flags into repo.Limits, whose 0 means the default.
func (f repoFlags) limits() repo.Limits {
	orUnlimited := func(v, unit int64) int64 {
		if v <= 0 {
			return -1
		}
		return v * unit
	}
	return repo.Limits{
		MaxReadBytes:   orUnlimited(f.fileReadMiB, 1<<20),
		TreeMaxEntries: int(orUnlimited(int64(f.treeEntries), 1)),
		QuotaBytes:     orUnlimited(f.accountRepoMiB, 1<<20),
		MaxPushBytes:   orUnlimited(f.pushMiB, 1<<20),
		MaxPushObjects: orUnlimited(f.pushObjects, 1),
	}
}

// setupFiles opens the accounts' repositories and the file service over
// them.
func setupFiles(o filesOptions, c *clusterOptions, stor *storage, authn *auth.Authenticator, log *slog.Logger) (*repo.Manager, *files.Service, error) {
	repos, err := repo.New(repo.Options{
		Root:      filepath.Join(stor.dataDir, "repos"),
		LocalURLs: []string{o.publicURL, "http://sandboxd.internal"},
		Access:    files.SubmoduleAccess{Auth: authn, Accounts: stor.st},
		Limits:    o.limits.limits(),
		// In a cluster every node serves every repository from its copy,
		// published through the database and the blob store.
		Shared: sharedRepos(c, stor.st, stor.blobs, stor.nodeID),
		Logger: log.With("component", "repo"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open repositories: %w", err)
	}
	fileSvc, err := files.New(files.Options{
		Repos:     repos,
		Fetcher:   fetch.New(fetch.Options{AllowPrivate: o.allowPrivate, Logger: log.With("component", "fetch")}),
		PublicURL: o.publicURL,
		TempDir:   filepath.Join(stor.dataDir, "tmp"),
		// Uploads reserve their room in the database, which every node of
		// a cluster shares.
		Reservations: stor.st,
		Logger:       log.With("component", "files"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("start file service: %w", err)
	}
	return repos, fileSvc, nil
}

// persistOptions are the flags of the accounts' snapshots.
type persistOptions struct {
	snapshotTTL time.Duration
	snapshotMiB int64
}

func (o *persistOptions) register(f *pflag.FlagSet) {
	f.DurationVar(&o.snapshotTTL, "snapshot-ttl", 7*24*time.Hour, "how long an account's snapshot row stays valid (env SANDBOXD_SNAPSHOT_TTL)")
	f.Int64Var(&o.snapshotMiB, "account-snapshot-mib", 2048, "snapshot blobs one account may store, in MiB; 0 unlimited")
}

func (o *persistOptions) check() error {
	return firstError(
		atLeast("snapshot-ttl", o.snapshotTTL, time.Second, "1s or more"),
		atLeast("account-snapshot-mib", o.snapshotMiB, 0, "0 (unlimited) or more"),
	)
}

// setupPersistence builds the service that carries an account's work
// between its sandboxes (snapshots, workspace, mirror).
func setupPersistence(o persistOptions, diskMiB int64, d domainDeps, repos *repo.Manager, log *slog.Logger) (*persist.Service, error) {
	return persist.New(persist.Options{
		Store: d.stor.st, Blobs: d.stor.blobs, Repos: repos, BaseDir: d.rt.baseDir,
		TempDir: filepath.Join(d.stor.dataDir, "tmp"), TTL: o.snapshotTTL,
		LayerBytes: diskMiB << 20, SnapshotQuota: o.snapshotMiB << 20,
		Mirror: d.forge.mirror,
		Logger: log.With("component", "persist"),
	})
}

// agentOptions are the flags of the tasks (setup, coding agent).
type agentOptions struct {
	runs int
}

func (o *agentOptions) register(f *pflag.FlagSet) {
	f.IntVar(&o.runs, "max-agent-runs-per-account", 4, "queued and executing coding-agent runs per account (more are refused with 429); 0 unlimited")
}

func (o *agentOptions) check() error {
	return atLeast("max-agent-runs-per-account", o.runs, 0, "0 (unlimited) or more")
}

// retentionOptions are the flags of how long what ended is kept.
type retentionOptions struct {
	keepStopped, keepRuns time.Duration
}

func (o *retentionOptions) register(f *pflag.FlagSet) {
	f.DurationVar(&o.keepStopped, "keep-stopped-sandboxes", retention.DefaultKeepSandboxes, "how long a stopped or failed sandbox is kept (listed, with its E2B record) before it is deleted; 0 keeps them forever (env SANDBOXD_KEEP_STOPPED_SANDBOXES)")
	f.DurationVar(&o.keepRuns, "keep-finished-runs", retention.DefaultKeepRuns, "how long a finished run's record and log are kept before they are deleted; 0 keeps them forever (env SANDBOXD_KEEP_FINISHED_RUNS)")
}

func (o *retentionOptions) check() error {
	return firstError(
		atLeast("keep-stopped-sandboxes", o.keepStopped, 0, "0 (forever) or more"),
		atLeast("keep-finished-runs", o.keepRuns, 0, "0 (forever) or more"),
	)
}

// setupRetention builds the sweeper of old sandboxes and runs; every node
// runs one: the deletes are idempotent batches, and each node keeps the
// logs of the runs it worked.
func setupRetention(o retentionOptions, stor *storage, log *slog.Logger) (*retention.Sweeper, error) {
	sweeper, err := retention.New(retention.Config{
		Store: stor.st, Logs: runs.Logs{DataDir: stor.dataDir},
		KeepSandboxes: o.keepStopped, KeepRuns: o.keepRuns,
		Logger: log.With("component", "retention"),
	})
	if err != nil {
		return nil, &flagError{[]string{"keep-stopped-sandboxes", "keep-finished-runs"}, fmt.Errorf("--keep-stopped-sandboxes, --keep-finished-runs: %w", err)}
	}
	return sweeper, nil
}

// forgeOptions are the flags of GitHub, where accounts' work is mirrored
// and the coding agent's pull requests go.
type forgeOptions struct {
	token, owner, apiURL string
}

func (o *forgeOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.token, "github-token", "", "GitHub token for the mirrors and pull requests, used on the host only, never given to sandboxes (env GITHUB_TOKEN)")
	f.StringVar(&o.owner, "github-owner", "", "GitHub organization or user that receives a mirror repository per account and the coding agent's pull requests; needs --github-token (env SANDBOXD_GITHUB_OWNER)")
	f.StringVar(&o.apiURL, "github-api-url", "", "GitHub REST API base URL (default GitHub's own; GitHub Enterprise: https://HOST/api/v3/) (env SANDBOXD_GITHUB_API_URL)")
}

// forgeParts are GitHub and the mirror on it; both nil unless configured
// (--github-token and --github-owner).
type forgeParts struct {
	gh     forge.Forge
	mirror *forge.Mirror
}

// setupForge configures GitHub: no request is made until it is used.
func setupForge(o forgeOptions, log *slog.Logger) (*forgeParts, error) {
	p := &forgeParts{}
	if o.token == "" || o.owner == "" {
		return p, nil
	}
	flags := []string{"github-owner", "github-api-url"}
	g, err := forge.NewGitHub(forge.Options{Token: o.token, Owner: o.owner, BaseURL: o.apiURL, Logger: log.With("component", "forge")})
	if err != nil {
		return nil, &flagError{flags, fmt.Errorf("configure GitHub: %w", err)}
	}
	if p.mirror, err = forge.NewMirror(forge.MirrorOptions{Forge: g, Token: o.token, Logger: log.With("component", "forge")}); err != nil {
		return nil, fmt.Errorf("configure GitHub mirror: %w", err)
	}
	p.gh = g
	return p, nil
}
