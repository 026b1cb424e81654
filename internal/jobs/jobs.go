// Package jobs owns the background job queue: River on the same database as
// the store (SQLite by default, PostgreSQL when configured), its schema
// migrations, the job argument types, and routing of jobs to the node that
// hosts their sandbox.
//
// Jobs are inserted in the same database transaction as the rows they act
// on (transactional enqueue), so a job exists exactly when its run row does.
// Each node works two queues: "default", which any node may take, and its
// own "node-<id>" queue for jobs that must run where their sandbox lives.
// River's queue names cannot contain ':', hence "node-" rather than "node:".
package jobs

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver"
	"github.com/riverqueue/river/riverdriver/riverdatabasesql"
	"github.com/riverqueue/river/riverdriver/riversqlite"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Job kinds, as the API names the tasks.
const (
	KindRunCommand     = "run-sandbox-command"
	KindSetupSandbox   = "setup-sandbox"
	KindCodingAgent    = "coding-agent"
	KindStopSandbox    = "stop-sandbox"
	KindBuildTemplate  = "build-template"
	KindDeliverWebhook = "deliver-webhook"
)

// DeliverWebhookArgs delivers one event to one webhook (internal/webhooks):
// the delivery's row says which; River retries a failed attempt, with the
// worker's backoff, until DeliveryAttempts have been made.
type DeliverWebhookArgs struct {
	DeliveryID string `json:"delivery_id"`
}

// DeliveryAttempts is how many times a delivery is tried.
const DeliveryAttempts = 8

// Kind implements river.JobArgs.
func (DeliverWebhookArgs) Kind() string { return KindDeliverWebhook }

// InsertOpts implements river.JobArgsWithInsertOpts: a delivery has more
// attempts than a command, and any node may make them.
func (DeliverWebhookArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: DeliveryAttempts}
}

// BuildTemplateArgs builds a template (internal/templates) on the node
// whose cache will hold it. Everything the worker needs is in the
// template's row; the job only points at it, and runs again after a
// restart until the row is ready or failed.
type BuildTemplateArgs struct {
	TemplateID string `json:"template_id"`
}

// Kind implements river.JobArgs.
func (BuildTemplateArgs) Kind() string { return KindBuildTemplate }

// RunCommandArgs runs the command of a run in its sandbox. Everything the
// worker needs is in the run row; the job only points at it.
type RunCommandArgs struct {
	RunID string `json:"run_id"`
}

// Kind implements river.JobArgs.
func (RunCommandArgs) Kind() string { return KindRunCommand }

// SetupSandboxArgs sets up an account's repository and first snapshot.
type SetupSandboxArgs struct {
	RunID string `json:"run_id"`
}

// Kind implements river.JobArgs.
func (SetupSandboxArgs) Kind() string { return KindSetupSandbox }

// CodingAgentArgs runs a coding agent on a repository.
type CodingAgentArgs struct {
	RunID string `json:"run_id"`
}

// Kind implements river.JobArgs.
func (CodingAgentArgs) Kind() string { return KindCodingAgent }

// StopSandboxArgs stops a sandbox on the node that hosts it.
type StopSandboxArgs struct {
	SandboxID string `json:"sandbox_id"`
	Reason    string `json:"reason"`
}

// Kind implements river.JobArgs.
func (StopSandboxArgs) Kind() string { return KindStopSandbox }

// NodeQueue is the queue of jobs that must run on node id.
func NodeQueue(nodeID string) string {
	return "node-" + strings.ToLower(nodeID)
}

// Config configures a Client.
type Config struct {
	NodeID string
	// Workers are the job implementations; nil makes an insert-only client.
	Workers *river.Workers
	// Concurrency is how many jobs of each queue run at once on this node.
	Concurrency int
	// PerAccount is how many jobs of one account run at once on this node,
	// over all its queues (0: no limit). Jobs beyond it wait, snoozed,
	// while other accounts' jobs get the workers.
	PerAccount int
	// PostgresDSN is the database URL when the store is PostgreSQL; River
	// listens for new jobs on a pgx pool of its own.
	PostgresDSN string
	// FetchCooldown and FetchPollInterval, when set, replace how often
	// River looks for jobs (defaultFetchCooldown, and
	// defaultFetchPollInterval or postgresFetchPollInterval).
	// Serve keeps the defaults; BenchmarkPlacementDispatch (package cluster)
	// measures a queue tuned with them.
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	Logger            *slog.Logger
}

// How often River looks for jobs by default: at most every
// defaultFetchCooldown when told of new ones (LISTEN/NOTIFY on PostgreSQL),
// and every defaultFetchPollInterval regardless. Short polling keeps
// insert-to-work latency low on SQLite, which has no LISTEN/NOTIFY. On
// PostgreSQL a NOTIFY wakes the fetch of an inserted job, so the poll only
// catches a notification missed (the listener reconnecting): there it is
// postgresFetchPollInterval. At 50 ms River's polls were 85 % of an idle
// node's statements (36 a second); at 1 s an idle node makes 7.7, and one
// PostgreSQL core carries 450-500 idle nodes instead of 100 (docs/CLUSTER.md).
const (
	defaultFetchCooldown      = 5 * time.Millisecond
	defaultFetchPollInterval  = 50 * time.Millisecond
	postgresFetchPollInterval = time.Second
)

// Client inserts and works jobs.
type Client struct {
	river    *river.Client[*sql.Tx]
	listener *pgxpool.Pool
	db       *sql.DB
	dialect  string
}

// New migrates River's schema and returns a client. Call Start to work jobs.
func New(ctx context.Context, st *store.Store, cfg Config) (*Client, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	var (
		driver   riverdriver.Driver[*sql.Tx]
		listener *pgxpool.Pool
		poll     = defaultFetchPollInterval
	)
	switch st.Dialect() {
	case store.DialectSQLite:
		driver = riversqlite.New(st.DB())
	case store.DialectPostgres:
		poll = postgresFetchPollInterval
		var err error
		listener, err = pgxpool.New(ctx, cfg.PostgresDSN)
		if err != nil {
			return nil, fmt.Errorf("connect job listener: %w", err)
		}
		driver = riverdatabasesql.NewWithPgxListener(st.DB(), listener)
	default:
		return nil, fmt.Errorf("jobs: unsupported database %q", st.Dialect())
	}
	closeListener := func() {
		if listener != nil {
			listener.Close()
		}
	}
	log := riverLogger(cfg.Logger)
	migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Logger: log})
	if err != nil {
		closeListener()
		return nil, fmt.Errorf("prepare job queue migrations: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		closeListener()
		return nil, fmt.Errorf("migrate job queue schema: %w", err)
	}
	rc := &river.Config{
		Logger:       log,
		ErrorHandler: panicLogger{cfg.Logger},
		// Commands have side effects: a job is retried only when its worker
		// says so by returning an error before the command started.
		MaxAttempts: 3,
		// A job taken by a node that died is handed out again after this
		// long; workers check their run's state first, so a rescue never
		// runs a command twice.
		RescueStuckJobsAfter: 10 * time.Minute,
		FetchCooldown:        cmp.Or(cfg.FetchCooldown, defaultFetchCooldown),
		FetchPollInterval:    cmp.Or(cfg.FetchPollInterval, poll),
		JobTimeout:           -1, // runs carry their own deadline: the sandbox's
	}
	if cfg.Workers != nil {
		rc.Workers = cfg.Workers
		if cfg.PerAccount > 0 {
			rc.Middleware = []rivertype.Middleware{newFairShare(cfg.PerAccount, storeAccountOf(st))}
		}
		rc.Queues = map[string]river.QueueConfig{
			river.QueueDefault:    {MaxWorkers: cfg.Concurrency},
			NodeQueue(cfg.NodeID): {MaxWorkers: cfg.Concurrency},
		}
	}
	client, err := river.NewClient(driver, rc)
	if err != nil {
		closeListener()
		return nil, fmt.Errorf("create job client: %w", err)
	}
	return &Client{river: client, listener: listener, db: st.DB(), dialect: st.Dialect()}, nil
}

// InsertTx enqueues args inside tx. With a node id the job runs on that
// node; otherwise on any.
func (c *Client) InsertTx(ctx context.Context, tx *sql.Tx, args river.JobArgs, nodeID string) error {
	opts := &river.InsertOpts{}
	if nodeID != "" {
		opts.Queue = NodeQueue(nodeID)
	}
	if _, err := c.river.InsertTx(ctx, tx, args, opts); err != nil {
		return fmt.Errorf("enqueue %s job: %w", args.Kind(), err)
	}
	return nil
}

// Insert enqueues args in a transaction of its own.
func (c *Client) Insert(ctx context.Context, args river.JobArgs, nodeID string) error {
	opts := &river.InsertOpts{}
	if nodeID != "" {
		opts.Queue = NodeQueue(nodeID)
	}
	if _, err := c.river.Insert(ctx, args, opts); err != nil {
		return fmt.Errorf("enqueue %s job: %w", args.Kind(), err)
	}
	return nil
}

// MoveQueue moves the jobs waiting on queue from (available, scheduled or
// retryable: none that a worker holds) to queue to, where other nodes'
// workers take them: the queue of a node declared down. River has no call
// for it; its job table (river_job: queue, state) is its documented schema.
func (c *Client) MoveQueue(ctx context.Context, from, to string) error {
	q := "UPDATE river_job SET queue = ? WHERE queue = ? AND state IN ('available', 'scheduled', 'retryable')"
	if c.dialect == store.DialectPostgres {
		q = "UPDATE river_job SET queue = $1 WHERE queue = $2 AND state IN ('available', 'scheduled', 'retryable')"
	}
	if _, err := c.db.ExecContext(ctx, q, to, from); err != nil {
		return fmt.Errorf("move the jobs of queue %s to %s: %w", from, to, err)
	}
	return nil
}

// Start begins working jobs until Stop.
func (c *Client) Start(ctx context.Context) error {
	if err := c.river.Start(ctx); err != nil {
		return fmt.Errorf("start job workers: %w", err)
	}
	return nil
}

// Stop waits for running jobs to finish (until ctx ends) and releases the
// client's connections.
func (c *Client) Stop(ctx context.Context) error {
	err := c.river.Stop(ctx)
	if c.listener != nil {
		c.listener.Close()
	}
	if err != nil {
		return fmt.Errorf("stop job workers: %w", err)
	}
	return nil
}

// Close releases an insert-only client's connections (Stop does this for a
// started one).
func (c *Client) Close() {
	if c.listener != nil {
		c.listener.Close()
	}
}
