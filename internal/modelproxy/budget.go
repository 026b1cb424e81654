package modelproxy

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Budgets bound what one account may use of the operator's providers in
// one UTC day; 0 is unlimited.
type Budgets struct {
	// RequestsPerDay counts the requests forwarded.
	RequestsPerDay int64
	// TokensPerDay counts the tokens the providers reported: input (cache
	// writes and reads included) and output.
	TokensPerDay int64
}

// Default budgets: what a small team's account spends on a busy day of
// coding agents with room to spare (Claude Code's conversations are
// mostly cache reads, a few million tokens an hour), while a runaway loop
// stops within the day.
const (
	DefaultRequestsPerDay = 10_000
	DefaultTokensPerDay   = 50_000_000
)

// UsageStore keeps each account's usage per UTC day, shared by every node
// of a cluster (internal/store).
type UsageStore interface {
	GetModelUsage(ctx context.Context, accountID string, day time.Time) (store.ModelUsage, error)
	AddModelUsage(ctx context.Context, add store.ModelUsage) (store.ModelUsage, error)
}

// AccountUsage is an account's use of the providers today (UTC), with
// the budgets it is held to and when the count starts again.
type AccountUsage struct {
	store.ModelUsage
	Budgets  Budgets
	ResetsAt time.Time
}

// Usage returns accountID's usage today. Without a usage store it is
// zero, and unlimited.
func (p *Proxy) Usage(ctx context.Context, accountID string) (AccountUsage, error) {
	day := store.UTCDay(p.opts.Now())
	u := AccountUsage{ModelUsage: store.ModelUsage{AccountID: accountID, Day: day}, Budgets: p.opts.Budgets, ResetsAt: day.AddDate(0, 0, 1)}
	if p.opts.Usage == nil {
		return u, nil
	}
	mu, err := p.opts.Usage.GetModelUsage(ctx, accountID, day)
	if err != nil {
		return AccountUsage{}, fmt.Errorf("model usage of %s: %w", accountID, err)
	}
	u.ModelUsage = mu
	return u, nil
}

// refusal is a request the proxy answers itself.
type refusal struct {
	status int
	reason string // the refusals counter's label
	msg    string
	// retryAfter, when set, says when asking again may succeed.
	retryAfter time.Duration
}

func (f *refusal) write(w http.ResponseWriter) {
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(f.retryAfter.Round(time.Second)/time.Second), 10))
	}
	// The providers' SDKs retry a 429 (and 5xx) unless told not to; a
	// budget is spent until midnight, a forbidden endpoint for good.
	w.Header().Set("X-Should-Retry", "false")
	writeError(w, f.status, f.msg)
}

// checkBudgets refuses, before anything is forwarded, a request of an
// account whose day's usage has reached a budget; nil lets it through. A
// request that starts under budget is forwarded whole, and what it used
// counts when its answer ends, so concurrent requests may take an account
// past its budget by what they use.
func (p *Proxy) checkBudgets(ctx context.Context, account string, now time.Time) (*refusal, error) {
	b := p.opts.Budgets
	if p.opts.Usage == nil || (b.RequestsPerDay <= 0 && b.TokensPerDay <= 0) {
		return nil, nil
	}
	u, err := p.opts.Usage.GetModelUsage(ctx, account, now)
	if err != nil {
		return nil, fmt.Errorf("check model budgets of %s: %w", account, err)
	}
	p.showUsage(u)
	resets := store.UTCDay(now).AddDate(0, 0, 1)
	spent := func(reason, what string, used, budget int64) *refusal {
		return &refusal{
			status: http.StatusTooManyRequests, reason: reason, retryAfter: resets.Sub(now),
			msg: fmt.Sprintf("the account's daily model %s budget is spent: %d of %d %s used today (UTC); it resets at %s (in %s). GET /api/model/usage shows the account's usage",
				what, used, budget, what+"s", resets.Format(time.RFC3339), inMinutes(resets.Sub(now))),
		}
	}
	switch {
	case b.RequestsPerDay > 0 && u.Requests >= b.RequestsPerDay:
		return spent("request_budget", "request", u.Requests, b.RequestsPerDay), nil
	case b.TokensPerDay > 0 && u.Tokens() >= b.TokensPerDay:
		return spent("token_budget", "token", u.Tokens(), b.TokensPerDay), nil
	}
	return nil, nil
}

// inMinutes says how long d is to the minute ("5h0m", "12m"), for people.
func inMinutes(d time.Duration) string {
	if d < time.Minute {
		return "less than a minute"
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

// record counts a forwarded request and the tokens its answer reported
// on the account's day. It runs when the answer ended, however it ended
// (a caller that went away mid-stream included), on a context of its own:
// an answer cut short still used what it used.
func (p *Proxy) record(ctx context.Context, account string, day time.Time, used usage) {
	if p.opts.Usage == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	u, err := p.opts.Usage.AddModelUsage(ctx, store.ModelUsage{AccountID: account, Day: day, Requests: 1, InputTokens: used.input(), OutputTokens: used.output()})
	if err != nil {
		p.log.Error("model proxy: record usage", "account_id", account, "err", err)
		return
	}
	p.showUsage(u)
}

// showUsage sets the usage gauges to an account's day as last seen.
func (p *Proxy) showUsage(u store.ModelUsage) {
	p.m.usage.WithLabelValues(u.AccountID, "requests").Set(float64(u.Requests))
	p.m.usage.WithLabelValues(u.AccountID, "tokens").Set(float64(u.Tokens()))
}
