// Package retention owns how long ended work is kept: the rows of
// sandboxes that stopped or failed, and of finished runs, with what
// depends on them (the keys minted for a sandbox and its E2B record go
// with its row through the schema; a run's log is a file on the node that
// ran it). Without it both tables, and every list of them, grow for as
// long as accounts use the server.
//
// A Sweeper runs on every node. Every Interval it deletes the rows that
// ended longer ago than their keep (zero keeps them forever) through the
// store, in batches oldest first, a bounded number per sweep, and then the
// run logs of this node whose runs no longer have a row.
//
// Invariants:
//   - Only ended work goes: never a pending, running (paused too) or
//     stopping sandbox, a queued or executing run, an ended sandbox such a
//     run still names, or a row another still refers to. The store's
//     DELETE checks this itself, so a row that changed since it was
//     selected stays.
//   - A sweep is idempotent and holds no lock: nodes that sweep at once
//     delete each row once, and a sweep cut short (a crash, a restart)
//     loses nothing; the next one carries on.
//   - A run's log goes only once its row is gone, so a log the API can
//     still be asked for is never deleted.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Defaults of the sweep; serve's --keep-stopped-sandboxes and
// --keep-finished-runs default to the keeps.
const (
	// DefaultKeepSandboxes keeps an ended sandbox's row a week: long
	// enough to look back at what ran last week (GET /api/sandboxes), and
	// an account starting sandboxes all day keeps a bounded list.
	DefaultKeepSandboxes = 7 * 24 * time.Hour
	// DefaultKeepRuns keeps a finished run's record a month: its output
	// and status stay readable by runId well after its sandbox went.
	DefaultKeepRuns = 30 * 24 * time.Hour
	// DefaultInterval is how often a node sweeps.
	DefaultInterval = 10 * time.Minute
	// DefaultBatch is how many rows one DELETE takes: short enough not to
	// hold SQLite's one writer for long.
	DefaultBatch = 500
	// DefaultMaxBatches bounds the batches of each kind of row in one
	// sweep: a backlog (a server upgraded after years) drains over a few
	// sweeps instead of in one long one.
	DefaultMaxBatches = 20
)

// logLookup is how many run ids one store lookup checks.
const logLookup = 500

// Store deletes ended rows in batches (package store).
type Store interface {
	DeleteEndedSandboxes(ctx context.Context, before time.Time, from store.Cursor, limit int) (int, store.Cursor, error)
	DeleteRunsFinishedBefore(ctx context.Context, before time.Time, from store.Cursor, limit int) (int, store.Cursor, error)
	MissingRuns(ctx context.Context, ids []string) ([]string, error)
}

// Logs are the run logs this node keeps (runs.Logs).
type Logs interface {
	RunIDs() ([]string, error)
	Remove(id string) error
}

// Config configures a Sweeper.
type Config struct {
	Store Store
	// Logs are this node's run logs; nil: none are swept.
	Logs Logs
	// KeepSandboxes is how long a sandbox's row stays after it stopped
	// or failed; 0 keeps it forever.
	KeepSandboxes time.Duration
	// KeepRuns is how long a run's row stays after it finished; 0 keeps
	// it forever.
	KeepRuns time.Duration
	// Interval between sweeps (0: DefaultInterval).
	Interval time.Duration
	// Batch is the rows one DELETE takes (0: DefaultBatch), MaxBatches
	// how many batches of each kind a sweep runs at most (0:
	// DefaultMaxBatches).
	Batch, MaxBatches int
	// Now is the clock (tests); default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Sweeper deletes ended work past its keep, periodically (Run) or once
// (Sweep).
type Sweeper struct {
	cfg Config
	log *slog.Logger
}

// New returns a Sweeper. A negative keep is an error.
func New(cfg Config) (*Sweeper, error) {
	if cfg.KeepSandboxes < 0 || cfg.KeepRuns < 0 {
		return nil, fmt.Errorf("retention: negative keep (sandboxes %v, runs %v)", cfg.KeepSandboxes, cfg.KeepRuns)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.MaxBatches <= 0 {
		cfg.MaxBatches = DefaultMaxBatches
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sweeper{cfg: cfg, log: cfg.Logger}, nil
}

// Run sweeps at once and then every Interval until ctx ends.
func (s *Sweeper) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		res, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("retention sweep", "err", err)
		}
		if res != (Result{}) {
			s.log.Info("retention sweep deleted ended work", "sandboxes", res.Sandboxes, "runs", res.Runs, "run_logs", res.Logs)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Result counts what one sweep deleted.
type Result struct {
	Sandboxes, Runs, Logs int
}

// Sweep deletes, once, the sandboxes and runs that ended longer ago than
// their keep (at most MaxBatches batches of each), then the logs of runs
// without a row. A failure of one kind does not stop the others: the
// errors are joined.
func (s *Sweeper) Sweep(ctx context.Context) (Result, error) {
	var (
		res  Result
		errs []error
		now  = s.cfg.Now()
	)
	if keep := s.cfg.KeepSandboxes; keep > 0 {
		n, err := s.batches(ctx, now.Add(-keep), s.cfg.Store.DeleteEndedSandboxes)
		res.Sandboxes = n
		errs = append(errs, err)
	}
	if keep := s.cfg.KeepRuns; keep > 0 {
		n, err := s.batches(ctx, now.Add(-keep), s.cfg.Store.DeleteRunsFinishedBefore)
		res.Runs = n
		errs = append(errs, err)
	}
	if s.cfg.Logs != nil {
		n, err := s.removeOrphanLogs(ctx)
		res.Logs = n
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

// deleteFunc deletes one batch of rows that ended before a time.
type deleteFunc func(ctx context.Context, before time.Time, from store.Cursor, limit int) (int, store.Cursor, error)

// batches runs del from the oldest row until it reached the last one or
// ran MaxBatches batches, and says how many rows went.
func (s *Sweeper) batches(ctx context.Context, before time.Time, del deleteFunc) (int, error) {
	total := 0
	from := store.Cursor{}
	for range s.cfg.MaxBatches {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		n, next, err := del(ctx, before, from, s.cfg.Batch)
		total += n
		if err != nil || next.IsZero() {
			return total, err
		}
		from = next
	}
	return total, nil
}

// removeOrphanLogs removes the logs this node keeps of runs that no longer
// have a row (deleted by a sweep on any node, by the count each account
// keeps, or with their account), and says how many went.
func (s *Sweeper) removeOrphanLogs(ctx context.Context) (int, error) {
	ids, err := s.cfg.Logs.RunIDs()
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for chunk := range slices.Chunk(ids, logLookup) {
		missing, err := s.cfg.Store.MissingRuns(ctx, chunk)
		if err != nil {
			return removed, errors.Join(append(errs, err)...)
		}
		for _, id := range missing {
			if err := s.cfg.Logs.Remove(id); err != nil {
				errs = append(errs, err)
				continue
			}
			removed++
		}
	}
	return removed, errors.Join(errs...)
}
