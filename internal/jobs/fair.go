package jobs

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/sandboxd/sandboxd/internal/store"
)

// fairSnooze is how long a job of an account already at its share waits
// before it is fetched again. Snoozing frees the worker at once and does not
// count as an attempt.
const fairSnooze = time.Second

// fairShare is worker middleware that bounds how many jobs of one account
// run at once on this node (over all its queues), so that one account's
// backlog cannot hold every worker: a job of an account at its share is
// snoozed, and the worker goes to the next job, another account's.
// Open-source River has no per-key concurrency limit of its own.
type fairShare struct {
	river.MiddlewareDefaults

	limit     int
	accountOf func(ctx context.Context, job *rivertype.JobRow) string

	mu      sync.Mutex
	running map[string]int
}

func newFairShare(limit int, accountOf func(context.Context, *rivertype.JobRow) string) *fairShare {
	return &fairShare{limit: limit, accountOf: accountOf, running: map[string]int{}}
}

// Work implements rivertype.WorkerMiddleware.
func (f *fairShare) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	if job.Kind == KindStopSandbox {
		// Short, and it frees what the account holds: never made to wait.
		return doInner(ctx)
	}
	account := f.accountOf(ctx, job)
	if account == "" {
		// Not attributable (its run is gone, say): the worker decides.
		return doInner(ctx)
	}
	f.mu.Lock()
	if f.running[account] >= f.limit {
		f.mu.Unlock()
		return river.JobSnooze(fairSnooze)
	}
	f.running[account]++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		if f.running[account]--; f.running[account] <= 0 {
			delete(f.running, account)
		}
		f.mu.Unlock()
	}()
	return doInner(ctx)
}

// storeAccountOf returns the account a job works for, from the run or the
// sandbox its arguments name (every job kind of this package names one).
func storeAccountOf(st *store.Store) func(context.Context, *rivertype.JobRow) string {
	return func(ctx context.Context, job *rivertype.JobRow) string {
		var ids struct {
			RunID      string `json:"run_id"`
			SandboxID  string `json:"sandbox_id"`
			TemplateID string `json:"template_id"`
			DeliveryID string `json:"delivery_id"`
		}
		if err := json.Unmarshal(job.EncodedArgs, &ids); err != nil {
			return ""
		}
		switch {
		case ids.RunID != "":
			if r, err := st.GetRun(ctx, ids.RunID); err == nil {
				return r.AccountID
			}
		case ids.SandboxID != "":
			if sb, err := st.GetSandbox(ctx, ids.SandboxID); err == nil {
				return sb.AccountID
			}
		case ids.TemplateID != "":
			if t, err := st.GetTemplate(ctx, ids.TemplateID); err == nil {
				return t.AccountID
			}
		case ids.DeliveryID != "":
			if d, err := st.GetDelivery(ctx, ids.DeliveryID); err == nil {
				return d.AccountID
			}
		}
		return ""
	}
}
