package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"
	"github.com/spf13/cobra"

	"github.com/sandboxd/sandboxd/internal/agents"
	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/blob"
	"github.com/sandboxd/sandboxd/internal/console"
	"github.com/sandboxd/sandboxd/internal/e2b"
	"github.com/sandboxd/sandboxd/internal/fetch"
	"github.com/sandboxd/sandboxd/internal/files"
	"github.com/sandboxd/sandboxd/internal/forge"
	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/jobs"
	"github.com/sandboxd/sandboxd/internal/kernel"
	"github.com/sandboxd/sandboxd/internal/mcpserver"
	"github.com/sandboxd/sandboxd/internal/membership"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/persist"
	"github.com/sandboxd/sandboxd/internal/progress/display"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/retention"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/gvisor"
	"github.com/sandboxd/sandboxd/internal/runtime/microvm"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// serveOptions are the settings of `sandboxd serve`.
type serveOptions struct {
	listen       string
	snapshotTTL  time.Duration
	runtimeName  string
	template     string
	rootfs       string
	platform     string
	runsc        string
	warmPool     int
	prewarm      int
	timeout      time.Duration
	maxTimeout   time.Duration
	maxPaused    time.Duration
	perAccount   int
	nodeCapacity int
	cpus         float64
	memoryMiB    int64
	pids         int64
	diskMiB      int64
	diskReserve  int64
	logMaxMiB    int64
	snapshotMiB  int64
	concurrency  int
	jobsPerAcct  int
	agentRuns    int
	metricsAddr  string
	adminKeyFile string
	keep         bool
	publicURL    string
	allowPrivate bool
	blobURL      string
	blobCacheMiB int64
	e2bDomain    string
	setup        bool
	network      netpol.Policy
	netPool      netip.Prefix
	netPrefix    string
	netDNS       []netip.Addr
	netPrivate   []netip.Prefix
	netRate      uint64
	netConns     uint32
	home         homegate.Limits
	githubToken  string
	githubOwner  string
	githubAPI    string
	claudeToken  string
	anthropicKey string
	anthropicURL string
	modelURL     string
	modelKey     string
	modelName    string
	modelMaxBody int64
	modelBudgets modelproxy.Budgets
	repoLimits   repoFlags
	cluster      clusterOptions
	keepStopped  time.Duration
	keepRuns     time.Duration

	// bodyIdle and bodyTotal are the API's request body deadlines (0:
	// none).
	bodyIdle, bodyTotal time.Duration
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
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "address to serve the API on (env SANDBOXD_LISTEN)")
	f.DurationVar(&o.snapshotTTL, "snapshot-ttl", 7*24*time.Hour, "how long an account's snapshot row stays valid (env SANDBOXD_SNAPSHOT_TTL)")
	f.StringVar(&o.runtimeName, "runtime", "gvisor", "sandbox backend (env SANDBOXD_RUNTIME): gvisor (the fastest strong one here) or microvm (QEMU; its kernel is built on first use, as by 'sandboxd kernel build')")
	f.StringVar(&o.template, "template", image.DefaultTemplate, "image template sandboxes start from, built on first use (env SANDBOXD_TEMPLATE): "+templateNames()+"; base and minimal suit smaller hosts but have no agent CLIs (prompts need full)")
	f.StringVar(&o.rootfs, "rootfs", "", "use this root filesystem directory instead of a built image (env SANDBOXD_ROOTFS)")
	f.StringVar(&o.runsc, "runsc", "", "the runsc binary (env SANDBOXD_RUNSC); empty: "+gvisor.BundledRunsc+" (scripts/install-runsc.sh) when a trial sandbox boots with it, else runsc in PATH")
	f.StringVar(&o.platform, "gvisor-platform", "", "gVisor platform (ptrace, systrap, kvm); empty probes for the fastest that works")
	f.IntVar(&o.warmPool, "warm-pool", 2, "sandboxes kept started ahead of time (env SANDBOXD_WARM_POOL)")
	f.IntVar(&o.prewarm, "prewarm", 8, "accounts whose next sandbox is kept started from their snapshot, least recently used dropped first (env SANDBOXD_PREWARM)")
	f.DurationVar(&o.timeout, "sandbox-timeout", 10*time.Minute, "default sandbox lifetime (env SANDBOXD_SANDBOX_TIMEOUT)")
	f.DurationVar(&o.maxTimeout, "sandbox-max-timeout", 24*time.Hour, "longest lifetime a request may ask for (env SANDBOXD_SANDBOX_MAX_TIMEOUT)")
	f.DurationVar(&o.maxPaused, "max-paused", 7*24*time.Hour, "longest a sandbox may stay paused (its timeout does not run meanwhile): past it the sandbox is stopped and its saved memory deleted; 0 unlimited (env SANDBOXD_MAX_PAUSED)")
	f.IntVar(&o.perAccount, "max-sandboxes-per-account", 10, "concurrent sandboxes per account; 0 unlimited")
	f.IntVar(&o.nodeCapacity, "node-capacity", 200, "concurrent sandboxes on this node; 0 unlimited")
	f.Float64Var(&o.cpus, "sandbox-cpus", 1, "CPU cores per sandbox; 0 unlimited")
	f.Int64Var(&o.memoryMiB, "sandbox-memory-mib", 1024, "memory per sandbox in MiB")
	f.Int64Var(&o.pids, "sandbox-pids", 512, "processes and threads per sandbox")
	f.Int64Var(&o.diskMiB, "sandbox-disk-mib", 4096, "size of a sandbox's writable layer in MiB; 0 unlimited")
	f.Int64Var(&o.diskReserve, "disk-reserve-mib", 1024, "MiB of the data directory's disk never promised to sandboxes: a create whose disk the node could not honour if every sandbox filled its own is refused (429), and so is a pause or fork whose saved memory it could not hold besides")
	f.Int64Var(&o.logMaxMiB, "log-max-mib", 16, "cap in MiB of each log a sandbox fills (a run's log, gVisor's agent.log, a microVM's console and qemu.log): the head and the tail are kept, with a line saying how much was dropped (env SANDBOXD_LOG_MAX_MIB)")
	f.Int64Var(&o.snapshotMiB, "account-snapshot-mib", 2048, "snapshot blobs one account may store, in MiB; 0 unlimited")
	f.DurationVar(&o.keepStopped, "keep-stopped-sandboxes", retention.DefaultKeepSandboxes, "how long a stopped or failed sandbox is kept (listed, with its E2B record) before it is deleted; 0 keeps them forever (env SANDBOXD_KEEP_STOPPED_SANDBOXES)")
	f.DurationVar(&o.keepRuns, "keep-finished-runs", retention.DefaultKeepRuns, "how long a finished run's record and log are kept before they are deleted; 0 keeps them forever (env SANDBOXD_KEEP_FINISHED_RUNS)")
	f.BoolVar(&o.keep, "keep-sandboxes", true, "leave this node's sandboxes running on shutdown (they are re-attached at the next start); false stops them")
	f.StringVar(&o.publicURL, "public-url", "", "base URL clients reach this server at, used in repository URLs (default http://LISTEN)")
	f.BoolVar(&o.allowPrivate, "allow-private-downloads", false, "let file uploads download from private, loopback and link-local addresses (never metadata addresses)")
	f.StringVar(&o.blobURL, "blob-store", "", "where snapshots are stored: empty for DATA_DIR/blobs, or s3://ACCESS:SECRET@host:port/bucket/prefix?tls=false (env SANDBOXD_BLOB_STORE)")
	f.StringVar(&o.e2bDomain, "e2b-domain", "", "wildcard domain the E2B API's sandboxes are reached at: PORT-ID.DOMAIN is that port of that sandbox (the SDKs' getHost); point *.DOMAIN at this server (env SANDBOXD_E2B_DOMAIN)")
	f.Int64Var(&o.blobCacheMiB, "blob-cache-mib", 4096, "MiB of snapshot layers read from an S3 --blob-store that are kept in DATA_DIR/cache/blobs, least recently used evicted first; 0 disables (env SANDBOXD_BLOB_CACHE_MIB)")
	f.Var(newPolicyValue(&o.network, netpol.ModeNone), "network-default", `network of sandboxes whose request names none: "none" (loopback only) or "egress" (env SANDBOXD_NETWORK_DEFAULT)`)
	f.Var(newPrefixValue(&o.netPool, netpol.DefaultPool), "network-pool", "IPv4 range sandbox addresses come from (a /30 each)")
	f.StringVar(&o.netPrefix, "network-prefix", netpol.DefaultPrefix, "1-4 lowercase letters starting the names of the host's links, namespaces and nftables table this server makes; two servers on one host need prefixes neither of which starts the other (env SANDBOXD_NETWORK_PREFIX)")
	f.Var(newAddrListValue(&o.netDNS), "network-dns", "resolvers each sandbox's own resolver asks (default: the host's IPv4 nameservers)")
	f.Var(newPrefixListValue(&o.netPrivate), "network-allow-private", "private ranges (CIDRs) sandboxes may reach; the host, other sandboxes and metadata stay denied")
	f.Uint64Var(&o.netRate, "network-rate", 100_000_000/8, "bandwidth per sandbox and direction, bytes/s")
	f.Uint32Var(&o.netConns, "network-max-conns", 1024, "concurrent connections per sandbox")
	f.IntVar(&o.home.MaxConns, "internal-max-conns-per-sandbox", 32, "concurrent connections one sandbox may hold to sandboxd.internal (429 beyond); 0 unlimited")
	f.Float64Var(&o.home.RequestsPerSecond, "internal-requests-per-second", 50, "requests per second one sandbox may make to sandboxd.internal (429 beyond); 0 unlimited")
	f.IntVar(&o.home.Burst, "internal-request-burst", 100, "requests one sandbox may make to sandboxd.internal in a burst above --internal-requests-per-second")
	f.BoolVar(&o.setup, "setup-on-first-use", true, "run the setup-sandbox task for an account's first sandbox")
	f.StringVar(&o.githubToken, "github-token", "", "GitHub token for the mirrors and pull requests, used on the host only, never given to sandboxes (env GITHUB_TOKEN)")
	f.StringVar(&o.githubOwner, "github-owner", "", "GitHub organization or user that receives a mirror repository per account and the coding agent's pull requests; needs --github-token (env SANDBOXD_GITHUB_OWNER)")
	f.StringVar(&o.githubAPI, "github-api-url", "", "GitHub REST API base URL (default GitHub's own; GitHub Enterprise: https://HOST/api/v3/) (env SANDBOXD_GITHUB_API_URL)")
	f.StringVar(&o.claudeToken, "claude-code-oauth-token", "", "Claude OAuth token the model proxy adds to sandboxes' Anthropic requests when no API key is set; never given to sandboxes (env CLAUDE_CODE_OAUTH_TOKEN)")
	f.StringVar(&o.anthropicKey, "anthropic-api-key", "", "Anthropic API key the model proxy adds to sandboxes' requests (Claude Code); never given to sandboxes (env ANTHROPIC_API_KEY)")
	f.StringVar(&o.anthropicURL, "anthropic-base-url", "https://api.anthropic.com", "the Anthropic API the model proxy forwards to (env SANDBOXD_ANTHROPIC_BASE_URL)")
	f.StringVar(&o.modelURL, "model-base-url", "", "OpenAI-compatible model API that prompts (opencode) use through the model proxy (env SANDBOXD_MODEL_BASE_URL)")
	f.StringVar(&o.modelKey, "model-api-key", "", "its API key, added by the model proxy; never given to sandboxes (env SANDBOXD_MODEL_API_KEY)")
	f.Int64Var(&o.modelMaxBody, "model-proxy-max-body", modelproxy.DefaultMaxBody, "largest request body, in bytes, a sandbox may send to a model API through the proxy (413 beyond)")
	f.Int64Var(&o.modelBudgets.TokensPerDay, "model-daily-tokens-per-account", modelproxy.DefaultTokensPerDay, "tokens (input with cache writes and reads, plus output, as the providers report them) one account's sandboxes may use through the model proxy per UTC day, over all nodes; past it the proxy answers 429 until midnight UTC; 0 unlimited")
	f.Int64Var(&o.modelBudgets.RequestsPerDay, "model-daily-requests-per-account", modelproxy.DefaultRequestsPerDay, "requests one account's sandboxes may send through the model proxy per UTC day, over all nodes (429 beyond, until midnight UTC); 0 unlimited")
	f.StringVar(&o.modelName, "model", "", "the model prompts use (env SANDBOXD_MODEL)")
	f.IntVar(&o.concurrency, "job-concurrency", 32, "jobs run at once per queue on this node")
	f.IntVar(&o.jobsPerAcct, "job-concurrency-per-account", 8, "jobs of one account run at once on this node, over all queues (the rest wait while other accounts' jobs run); 0 unlimited")
	f.IntVar(&o.agentRuns, "max-agent-runs-per-account", 4, "queued and executing coding-agent runs per account (more are refused with 429); 0 unlimited")
	f.Int64Var(&o.repoLimits.fileReadMiB, "max-file-read-mib", repo.DefaultMaxReadBytes>>20, "largest file GET /api/sandboxes/file returns, in MiB (413 beyond, checked from the object's size before reading); 0 unlimited")
	f.IntVar(&o.repoLimits.treeEntries, "filetree-max-entries", repo.DefaultTreeMaxEntries, "entries of the file tree GET /api/sandboxes lists (also cut at 4 MiB of paths; filetree_truncated says so); 0 unlimited")
	f.Int64Var(&o.repoLimits.accountRepoMiB, "account-repo-mib", repo.DefaultQuotaBytes>>20, "disk space one account's git repository may take, in MiB: pushes past it are refused by a pre-receive hook, uploads with 429; 0 unlimited")
	f.Int64Var(&o.repoLimits.pushMiB, "max-push-mib", repo.DefaultMaxPushBytes>>20, "largest pack one git push may send, in MiB (receive.maxInputSize; never more than --account-repo-mib); 0 unlimited")
	f.Int64Var(&o.repoLimits.pushObjects, "max-push-objects", repo.DefaultMaxPushObjects, "most objects one git push may send; 0 unlimited")
	f.DurationVar(&o.bodyIdle, "request-body-idle-timeout", api.DefaultBodyIdleTimeout, "how long an API request's body (an upload, a JSON body) may send nothing before it is cut off with 408; 0 never")
	f.DurationVar(&o.bodyTotal, "request-body-timeout", api.DefaultBodyTimeout, "how long an API request's body may take to arrive whole before it is cut off with 408; 0 never")
	o.cluster.register(f)
	f.StringVar(&o.adminKeyFile, "admin-key-file", "", "file holding the operators' key (at least 32 bytes): with it, River's job UI is served at /riverui/ to whoever gives that key as the password of HTTP Basic authentication; without it, not at all (env SANDBOXD_ADMIN_KEY_FILE)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:9090", "address to serve Prometheus /metrics on, apart from the API (env SANDBOXD_METRICS_ADDR); empty disables")
	return cmd
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

func serve(ctx context.Context, g *globals, o *serveOptions) error {
	log := g.logger(os.Stderr)
	if o.logMaxMiB < 1 || o.logMaxMiB > 1<<20 {
		return fmt.Errorf("--log-max-mib %d: want 1 to %d", o.logMaxMiB, 1<<20)
	}
	if o.modelBudgets.TokensPerDay < 0 || o.modelBudgets.RequestsPerDay < 0 {
		return errors.New("--model-daily-tokens-per-account and --model-daily-requests-per-account: want 0 (unlimited) or more")
	}
	if o.maxPaused < 0 {
		return fmt.Errorf("--max-paused %v: want 0 (unlimited) or more", o.maxPaused)
	}
	// Before the image and the runtime, which may take minutes.
	if err := o.cluster.checkTLS(); err != nil {
		return err
	}
	// The operator's credentials are in o now; take them out of this
	// process's environment so that no child (runsc, QEMU, git, hooks)
	// inherits them.
	for _, k := range []string{"GITHUB_TOKEN", "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "SANDBOXD_MODEL_API_KEY"} {
		_ = os.Unsetenv(k)
	}
	dataDir, err := filepath.Abs(g.dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	nodeID, err := sandbox.NodeID(dataDir)
	if err != nil {
		return err
	}
	log = log.With("node_id", nodeID)
	st, err := g.openStore(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	// Before the image and the runtime: a bad keep stops serve at once.
	sweeper, err := retention.New(retention.Config{
		Store: st, Logs: runs.Logs{DataDir: dataDir},
		KeepSandboxes: o.keepStopped, KeepRuns: o.keepRuns,
		Logger: log.With("component", "retention"),
	})
	if err != nil {
		return fmt.Errorf("--keep-stopped-sandboxes, --keep-finished-runs: %w", err)
	}

	baseDir, baseID, err := resolveRootfs(ctx, g, o, log)
	if err != nil {
		return err
	}
	limits := runtime.Limits{CPUs: o.cpus, MemoryBytes: o.memoryMiB << 20, Pids: o.pids, DiskBytes: o.diskMiB << 20}
	homeMetrics := homegate.NewMetrics()
	rt, err := openRuntime(ctx, o, dataDir, g, baseDir, baseID, limits, homeMetrics, log)
	if err != nil {
		return err
	}
	defer rt.Close()
	degraded := runtimeDegraded(rt)
	if len(degraded) > 0 && display.IsTerminal(os.Stderr) && !g.jsonLogs() {
		// The runtime logged each at WARN; a person at the terminal of
		// `make run` must not miss them among the info lines.
		writeDegradedBanner(os.Stderr, degraded)
	}

	workers := river.NewWorkers()
	jc, err := jobs.New(ctx, st, jobs.Config{
		NodeID: nodeID, Workers: workers, Concurrency: o.concurrency, PerAccount: o.jobsPerAcct,
		PostgresDSN: g.database, Logger: log.With("component", "jobs"),
	})
	if err != nil {
		return err
	}
	authn := auth.NewAuthenticator(st)
	if o.publicURL == "" {
		o.publicURL = "http://" + o.listen
	}
	blobs, err := blob.Open(ctx, o.blobURL, dataDir)
	if err != nil {
		return fmt.Errorf("open blob store: %w", err)
	}
	// A local store is local already: only a shared remote one is cached.
	var blobCache *blob.Cache
	if s3, ok := blobs.(*blob.S3); ok && o.blobCacheMiB != 0 {
		if blobCache, err = blob.NewCache(s3, filepath.Join(dataDir, "cache", "blobs"), o.blobCacheMiB<<20, log.With("component", "blobcache")); err != nil {
			return err // says "open blob cache DIR" already
		}
		blobs = blobCache
	}
	// The store's credentials (from its URL or the environment) are held
	// by blobs now: no child process needs them.
	for _, k := range []string{blob.EnvS3AccessKey, blob.EnvS3SecretKey, "SANDBOXD_BLOB_STORE"} {
		_ = os.Unsetenv(k)
	}
	repos, err := repo.New(repo.Options{
		Root:      filepath.Join(dataDir, "repos"),
		LocalURLs: []string{o.publicURL, "http://sandboxd.internal"},
		Access:    files.SubmoduleAccess{Auth: authn, Accounts: st},
		Limits:    o.repoLimits.limits(),
		// In a cluster every node serves every repository from its copy,
		// published through the database and the blob store.
		Shared: sharedRepos(o, st, blobs, nodeID),
		Logger: log.With("component", "repo"),
	})
	if err != nil {
		return fmt.Errorf("open repositories: %w", err)
	}
	fileSvc, err := files.New(files.Options{
		Repos:     repos,
		Fetcher:   fetch.New(fetch.Options{AllowPrivate: o.allowPrivate, Logger: log.With("component", "fetch")}),
		PublicURL: o.publicURL,
		TempDir:   filepath.Join(dataDir, "tmp"),
		// Uploads reserve their room in the database, which every node of
		// a cluster shares.
		Reservations: st,
		Logger:       log.With("component", "files"),
	})
	if err != nil {
		return fmt.Errorf("start file service: %w", err)
	}

	var (
		gh     forge.Forge
		mirror *forge.Mirror
	)
	if o.githubToken != "" && o.githubOwner != "" {
		g, err := forge.NewGitHub(forge.Options{Token: o.githubToken, Owner: o.githubOwner, BaseURL: o.githubAPI, Logger: log.With("component", "forge")})
		if err != nil {
			return fmt.Errorf("configure GitHub: %w", err)
		}
		if mirror, err = forge.NewMirror(forge.MirrorOptions{Forge: g, Token: o.githubToken, Logger: log.With("component", "forge")}); err != nil {
			return fmt.Errorf("configure GitHub mirror: %w", err)
		}
		gh = g
	}
	persistence, err := persist.New(persist.Options{
		Store: st, Blobs: blobs, Repos: repos, BaseDir: baseDir,
		TempDir: filepath.Join(dataDir, "tmp"), TTL: o.snapshotTTL,
		LayerBytes: o.diskMiB << 20, SnapshotQuota: o.snapshotMiB << 20,
		Mirror: mirror,
		Logger: log.With("component", "persist"),
	})
	if err != nil {
		return err
	}

	netMgr, defaultPolicy, err := openNetwork(ctx, o, dataDir, log)
	if err != nil {
		return err
	}
	if defaultPolicy.Mode != netpol.ModeNone && !rt.Capabilities().Network {
		return fmt.Errorf("--network-default %s: the %s runtime does not support sandbox networks yet; use --network-default none (or --runtime gvisor)", defaultPolicy.Mode, rt.Name())
	}

	if err := o.cluster.check(ctx, st, o.blobURL, nodeID); err != nil {
		return err
	}
	clu, err := o.cluster.open(st, nodeID, nodeCapacity(rt, dataDir, o.nodeCapacity, netMgr != nil), defaultPolicy.Mode != netpol.ModeNone, log)
	if err != nil {
		return err
	}
	homeSocket := filepath.Join(dataDir, "sandboxd.sock")
	mgr := sandbox.NewManager(sandbox.Config{
		Store: st, Runtime: rt, Jobs: jc, NodeID: nodeID, DataDir: dataDir, Access: authn,
		BaseDir: baseDir, BaseID: baseID, Home: homeSocket,
		Settings: sandbox.Settings{
			DefaultTimeout: o.timeout, MaxTimeout: o.maxTimeout, MaxPaused: o.maxPaused,
			PerAccount: o.perAccount, NodeCapacity: o.nodeCapacity, Limits: limits,
			DiskReserveBytes: o.diskReserve<<20 + blobCacheBytes(blobs),
			WarmSandboxes:    warmSandboxes(o),
			SetupOnFirstUse:  o.setup,
			Model:            runs.ModelProvider{BaseURL: o.modelURL, Model: o.modelName},
			Commands:         agentCommands(baseDir),
			Image:            imageName(o),
			Network:          defaultPolicy,
		},
		Persist: persistence,
		Hooks:   sandboxHooks(st, o, netMgr, persistence),
		Logger:  log.With("component", "sandbox"),

		LogMaxBytes: o.logMaxMiB << 20,
	})
	members := membership.New(membership.Config{Store: st, NodeID: nodeID, Node: clu.node, DownAfter: clu.downAfter,
		Sandboxes: mgr, Jobs: jc, Logger: log.With("component", "membership")})
	// The tasks that start sandboxes of their own (setup, coding agent)
	// drive them through the manager.
	agentSvc := agents.New(agents.Config{
		Store: st, Jobs: jc, Lifecycle: mgr, Node: members, Persist: persistence, Forge: gh,
		PublicURL: o.publicURL, Network: defaultPolicy, AgentRunsPerAccount: o.agentRuns,
		Logger: log.With("component", "agents"),
	})
	mgr.UseSetups(agentSvc)
	persistence.OnSnapshot(mgr.Prewarm)
	mgr.RegisterWorkers(workers)
	agentSvc.Register(workers)
	if err := mgr.Reconcile(ctx); err != nil {
		return fmt.Errorf("reconcile sandboxes: %w", err)
	}
	// What was started ahead went with the last process: start it again
	// for the accounts most likely to come back first.
	mgr.PrewarmRecent(ctx, o.prewarm)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), homeMetrics, mgr.NetworkMetrics(), mgr.PrewarmMetrics(), mgr.Metrics())
	if blobCache != nil {
		reg.MustRegister(blobCacheCollector{blobCache})
	}
	models, err := modelproxy.New(modelproxy.Options{
		Auth: authn,
		Upstreams: map[string]modelproxy.Upstream{
			modelproxy.Anthropic: {BaseURL: o.anthropicURL, APIKey: o.anthropicKey, BearerToken: o.claudeToken},
			modelproxy.OpenAI:    {BaseURL: o.modelURL, APIKey: o.modelKey},
		},
		MaxBody: o.modelMaxBody, Registry: reg, Logger: log.With("component", "modelproxy"),
		// Counted in the database, so every node of a cluster holds an
		// account to one budget.
		Usage: st, Budgets: o.modelBudgets,
	})
	if err != nil {
		return err
	}
	mcpSrv, err := mcpserver.New(mcpserver.Options{Store: st, Auth: authn, Sandboxes: mgr, Files: fileSvc, Cluster: mcpCluster(clu),
		Version: version, Logger: log.With("component", "mcp")})
	if err != nil {
		return err
	}
	portProxy := netpol.NewProxy(netpol.ProxyOptions{Resolve: mgr.GuestAddr, Logger: log.With("component", "proxy")})
	e2bAPI, err := e2b.New(e2b.Options{
		Domain: o.e2bDomain, Ports: portProxy,
		Sandboxes: mgr, Store: st, Auth: authn, NodeID: nodeID,
		// Every template name starts the server's image: the one it was
		// built from names it too.
		Templates: []string{o.template},
		CPUs:      int(math.Ceil(o.cpus)), MemoryMB: int(o.memoryMiB), DiskMB: int(o.diskMiB), MaxTimeout: o.maxTimeout,
		Cluster:     edgeCluster(clu),
		DefaultUser: e2b.DefaultUserOf(baseDir),
		Logger:      log.With("component", "e2b"),
	})
	if err != nil {
		return err
	}
	mounts := map[string]http.Handler{
		repo.GitPathPrefix + "*":    repos.GitHTTPHandler(authn),
		modelproxy.PathPrefix + "*": models,
		mcpserver.Path:              mcpSrv,
	}
	maps.Copy(mounts, e2bAPI.Routes())
	consoleMounts, err := console.Mounts()
	if err != nil {
		return err
	}
	maps.Copy(mounts, consoleMounts)
	// Before any work starts: a bad key file stops serve at once.
	uiCtx, stopUI := context.WithCancel(context.WithoutCancel(ctx))
	defer stopUI()
	riverUI, err := riverUIMounts(uiCtx, jc, o.adminKeyFile, log.With("component", "riverui"))
	if err != nil {
		return err
	}
	maps.Copy(mounts, riverUI)
	srv, err := api.New(api.Options{
		Store:        st,
		Auth:         authn,
		Logger:       log,
		Registry:     reg,
		Version:      version,
		Runtime:      describeRuntime(rt),
		Degraded:     degradedSummaries(degraded),
		Environments: persistence,
		Sandboxes:    mgr,
		SandboxFiles: mgr,
		Agents:       agentSvc,
		RunLogs:      runs.Logs{DataDir: dataDir},
		Proxy:        portProxy,
		Files:        fileSvc,
		Cluster:      apiCluster(clu),
		ModelUsage:   models,
		Mount:        mounts,
		// 0 in a flag is none; in Options, the default.
		BodyIdleTimeout: orNone(o.bodyIdle),
		BodyTimeout:     orNone(o.bodyTotal),
	})
	if err != nil {
		return fmt.Errorf("build API: %w", err)
	}

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.listen, err)
	}
	// The same API on a unix socket: the way home from inside sandboxes
	// (http://sandboxd.internal), authenticated like any other caller.
	_ = os.Remove(homeSocket)
	homeLn, err := net.Listen("unix", homeSocket)
	if err != nil {
		ln.Close()
		return fmt.Errorf("listen on %s: %w", homeSocket, err)
	}
	httpSrv := &http.Server{
		Handler:           e2bAPI.HostRouter(srv),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	// The way home serves the API, git, MCP and the model proxy only: no
	// E2B routes and no routing by Host (the E2B domain's port hosts).
	homeSrv := &http.Server{
		Handler:           homegate.Only(srv, "/api/", repo.GitPathPrefix, mcpserver.Path, modelproxy.PathPrefix),
		ReadHeaderTimeout: httpSrv.ReadHeaderTimeout,
		IdleTimeout:       httpSrv.IdleTimeout,
		ErrorLog:          httpSrv.ErrorLog,
	}

	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	if err := jc.Start(runCtx); err != nil {
		return err
	}
	go func() {
		if err := mgr.Run(runCtx); err != nil {
			log.Error("sandbox manager stopped", "err", err)
		}
	}()
	go func() {
		if err := members.Run(runCtx); err != nil {
			log.Error("cluster membership stopped", "err", err)
		}
	}()
	// Every node sweeps: the deletes are idempotent batches, and each
	// node keeps the logs of the runs it worked.
	go sweeper.Run(runCtx)

	log.Info("sandboxd serving", "addr", ln.Addr().String(), "data_dir", dataDir, "database", st.Dialect(),
		"runtime", rt.Name(), "image", baseID, "version", version)
	errc := make(chan error, 4)
	go func() { errc <- httpSrv.Serve(ln) }()
	go func() { errc <- homeSrv.Serve(homeLn) }()
	metricsSrv, err := serveMetrics(o.metricsAddr, reg, log, errc)
	if err != nil {
		_ = httpSrv.Close()
		return err
	}
	clusterSrv := clu.serve(api.ClusterHandler(apiCluster(clu), e2bAPI.HostRouter(srv), log), log, errc)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = errors.Join(httpSrv.Shutdown(shutdownCtx), homeSrv.Shutdown(shutdownCtx))
	if metricsSrv != nil {
		err = errors.Join(err, metricsSrv.Shutdown(shutdownCtx))
	}
	if clusterSrv != nil {
		err = errors.Join(err, clusterSrv.Shutdown(shutdownCtx))
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if o.keep {
		log.Info("shutting down; sandboxes keep running and are re-attached at the next start")
	} else {
		log.Info("shutting down; stopping this node's sandboxes")
		err = errors.Join(err, mgr.StopAll(shutdownCtx, "sandboxd shut down"))
	}
	// Running jobs get until the shutdown deadline. A run's command still
	// running then runs on in its kept sandbox (the agent owns it), and the
	// next start's reconcile follows it again; without --keep-sandboxes
	// its sandbox was stopped above and the run ended with it.
	err = errors.Join(err, jc.Stop(shutdownCtx))
	stopRun()
	return err
}

// blobCacheBytes is what the layer cache may take of the data dir's disk
// (0 without one): the disk admission must not promise it to sandboxes.
func blobCacheBytes(b blob.Store) int64 {
	if c, ok := b.(*blob.Cache); ok {
		return c.MaxBytes()
	}
	return 0
}

// agentCommands says which agent CLIs the base image has.
func agentCommands(rootfs string) map[string]bool {
	have := map[string]bool{}
	for _, name := range []string{"opencode", "claude", "openclaw"} {
		have[name] = image.HasCommand(rootfs, name)
	}
	return have
}

// imageName names the base image in messages, without host paths.
func imageName(o *serveOptions) string {
	if o.rootfs != "" {
		return "the --rootfs directory"
	}
	return "template " + o.template
}

// serveMetrics serves reg at /metrics on addr (nothing when addr is empty),
// apart from the API: the metrics name every route with its counts, which
// is for the operator, not for tenants (nor for sandboxes, which reach the
// API through the home socket). Serve errors go to errc.
func serveMetrics(addr string, reg *prometheus.Registry, log *slog.Logger, errc chan<- error) (*http.Server, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("serving metrics", "addr", ln.Addr().String())
	go func() { errc <- fmt.Errorf("metrics: %w", srv.Serve(ln)) }()
	return srv, nil
}

// resolveRootfs returns the root filesystem sandboxes start from: --rootfs,
// or the template's image, built now if the cache lacks it.
func resolveRootfs(ctx context.Context, g *globals, o *serveOptions, log *slog.Logger) (dir, id string, err error) {
	if o.rootfs != "" {
		dir, err := filepath.Abs(o.rootfs)
		if err != nil {
			return "", "", err
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return "", "", fmt.Errorf("--rootfs %s is not a directory", o.rootfs)
		}
		return dir, "rootfs:" + dir, nil
	}
	log = log.With("component", "image")
	img, err := image.NewStore(g.cacheDir, log).Ensure(ctx, o.template, g.tracker(os.Stderr, log))
	if err != nil {
		return "", "", fmt.Errorf("prepare image %s: %w", o.template, err)
	}
	return img.Rootfs, img.ID, nil
}

// openNetwork prepares sandbox networking and returns the default policy.
// Networking needs root and nftables in the kernel; when it cannot start,
// sandboxes run with loopback only, and a request for a network is refused
// with a clear error.
func openNetwork(ctx context.Context, o *serveOptions, dataDir string, log *slog.Logger) (*netpol.Manager, netpol.Policy, error) {
	def := o.network
	opts := netpol.Options{
		StateDir: filepath.Join(dataDir, "net"), Pool: o.netPool, Prefix: o.netPrefix,
		RateBytes: o.netRate, MaxConns: o.netConns, Logger: log.With("component", "network"),
	}
	// An empty list is no list: nil DNS means the host's nameservers.
	if len(o.netDNS) > 0 {
		opts.DNS = o.netDNS
	}
	if len(o.netPrivate) > 0 {
		opts.AllowPrivate = o.netPrivate
	}
	mgr, err := netpol.New(ctx, opts)
	if err != nil {
		if def.Mode != netpol.ModeNone {
			return nil, def, fmt.Errorf("start sandbox networking (needed by --network-default %s): %w", def.Mode, err)
		}
		log.Warn("sandbox networking unavailable; sandboxes get loopback only", "err", err)
		return nil, def, nil
	}
	return mgr, def, nil
}

// warmSandboxes is how many sandboxes the runtime's warm pool keeps
// started ahead: gVisor's (microVMs start from a memory snapshot instead).
// Prewarmed sandboxes are counted as they come (see admitDisk).
func warmSandboxes(o *serveOptions) int {
	if o.runtimeName == "gvisor" {
		return o.warmPool
	}
	return 0
}

// describeRuntime is the runtime in one line for GET /api/health: a
// backend that can say more (gVisor: platform and runsc) than its name.
func describeRuntime(rt runtime.Runtime) string {
	if d, ok := rt.(interface{ Describe() string }); ok {
		return d.Describe()
	}
	return rt.Name()
}

// runtimeDegraded is what the runtime lacks that a better setup would give
// it (gVisor: see gvisor.Runtime.Degraded); nil when nothing is.
func runtimeDegraded(rt runtime.Runtime) []gvisor.Degradation {
	if d, ok := rt.(interface{ Degraded() []gvisor.Degradation }); ok {
		return d.Degraded()
	}
	return nil
}

// degradedSummaries are the degradations as GET /api/health's degraded
// says them: public, no host paths.
func degradedSummaries(ds []gvisor.Degradation) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Summary)
	}
	return out
}

// writeDegradedBanner writes the degradations to a terminal as a box of
// wrapped lines: what is lost, then why, in full.
func writeDegradedBanner(w io.Writer, ds []gvisor.Degradation) {
	const width = 78
	rule := strings.Repeat("!", width)
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s\n  sandboxd runs DEGRADED:\n", rule)
	for _, d := range ds {
		b.WriteString("\n")
		for i, line := range wrapWords(d.Summary, width-6) {
			lead := "    "
			if i == 0 {
				lead = "  * "
			}
			b.WriteString(lead + line + "\n")
		}
		for _, line := range wrapWords("why: "+d.Detail, width-6) {
			b.WriteString("      " + line + "\n")
		}
	}
	fmt.Fprintf(&b, "\n  GET /api/health lists these under \"degraded\".\n%s\n\n", rule)
	_, _ = io.WriteString(w, b.String())
}

// wrapWords breaks s into lines of at most width characters at spaces (a
// longer word has a line of its own).
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(s) {
		switch {
		case line == "":
			line = word
		case len(line)+1+len(word) <= width:
			line += " " + word
		default:
			lines = append(lines, line)
			line = word
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// openRuntime starts the chosen sandbox backend.
func openRuntime(ctx context.Context, o *serveOptions, dataDir string, g *globals, baseDir, baseID string, limits runtime.Limits, homeMetrics *homegate.Metrics, log *slog.Logger) (runtime.Runtime, error) {
	cacheDir := g.cacheDir
	switch o.runtimeName {
	case "gvisor":
		rt, err := gvisor.New(ctx, gvisor.Options{
			StateDir:      filepath.Join(dataDir, "runtime", "gvisor"),
			RunscPath:     o.runsc,
			Platform:      o.platform,
			DefaultLimits: limits,
			WarmPool:      o.warmPool,
			Prewarm:       o.prewarm,
			MaxSandboxes:  o.nodeCapacity,
			WarmBaseDir:   baseDir,
			WarmBaseImage: baseID,
			LogMaxBytes:   o.logMaxMiB << 20,
			Home:          o.home,
			HomeMetrics:   homeMetrics,
			Logger:        log.With("component", "runtime"),
		})
		if err != nil {
			return nil, fmt.Errorf("start gvisor runtime: %w", err)
		}
		return rt, nil
	case "microvm":
		// QEMU microVMs with the kernel of `sandboxd kernel build`, built
		// now (with the same progress) when the cache lacks it; KVM when a
		// probe VM boots on it, TCG (slow) otherwise. New sandboxes start
		// from a memory snapshot of a booted template.
		klog := log.With("component", "kernel")
		if _, err := kernel.NewStore(cacheDir, klog).Ensure(ctx, g.tracker(os.Stderr, klog)); err != nil {
			return nil, fmt.Errorf("prepare the microVM guest kernel: %w", err)
		}
		rt, err := microvm.New(ctx, microvm.Options{
			StateDir:      filepath.Join(dataDir, "runtime", "microvm"),
			CacheDir:      cacheDir,
			DefaultLimits: limits,
			Template:      microvm.TemplateOptions{BaseDir: baseDir, BaseImage: baseID},
			LogMaxBytes:   o.logMaxMiB << 20,
			Home:          o.home,
			HomeMetrics:   homeMetrics,
			Logger:        log.With("component", "runtime"),
		})
		if err != nil {
			return nil, fmt.Errorf("start microvm runtime: %w", err)
		}
		return rt, nil
	}
	return nil, fmt.Errorf("unknown runtime %q (available: gvisor, microvm)", o.runtimeName)
}

// sandboxHooks are the concerns plugged into every sandbox's life, in the
// order they run: its own key, its network (when the server has
// networking), and persistence's (git's credentials, the account's
// snapshot).
func sandboxHooks(st *store.Store, o *serveOptions, netMgr *netpol.Manager, persistence *persist.Service) []sandbox.Hook {
	hooks := []sandbox.Hook{sandbox.NewKeyHook(sandbox.KeyHookConfig{
		Store: st,
		// No operator credential goes into a sandbox: models are reached
		// through the model proxy, GitHub from the host.
		AnthropicProxy: o.anthropicKey != "" || o.claudeToken != "",
	})}
	if netMgr != nil {
		hooks = append(hooks, sandbox.NewNetworkHook(netMgr))
	}
	return append(hooks, persistence.Hooks()...)
}
