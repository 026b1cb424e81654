package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ModelUsage is what one account used of the operator's model providers
// through the model proxy on one UTC day. As an argument of AddModelUsage
// it is the amount to add.
type ModelUsage struct {
	AccountID string `json:"account_id"`
	// Day is the UTC midnight that starts the day.
	Day      time.Time `json:"day"`
	Requests int64     `json:"requests"`
	// InputTokens counts the prompt with its cache writes and reads, as
	// the providers reported them; OutputTokens what they generated.
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// UpdatedAt is when the day's row last changed; zero while the
	// account used nothing that day.
	UpdatedAt time.Time `json:"updated_at"`
}

// Tokens is the day's input and output tokens together, what a token
// budget counts.
func (u ModelUsage) Tokens() int64 { return u.InputTokens + u.OutputTokens }

// UTCDay is the UTC midnight that starts t's day in UTC.
func UTCDay(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// maxUsageAdd bounds one addition of each count, so that no single
// report, however absurd, can overflow a day's sums.
const maxUsageAdd = 1 << 40

// GetModelUsage returns accountID's usage on the UTC day of day. A day
// with none is zero counts, not ErrNotFound: every account starts each
// day at zero.
func (q *Queries) GetModelUsage(ctx context.Context, accountID string, day time.Time) (ModelUsage, error) {
	u := ModelUsage{AccountID: accountID, Day: UTCDay(day)}
	var at int64
	err := q.queryRow(ctx, "SELECT requests, input_tokens, output_tokens, updated_at FROM model_usage WHERE account_id = ? AND day = ?",
		accountID, toMillis(u.Day)).Scan(&u.Requests, &u.InputTokens, &u.OutputTokens, &at)
	if errors.Is(err, sql.ErrNoRows) {
		return u, nil
	}
	if err != nil {
		return ModelUsage{}, fmt.Errorf("get model usage of %s on %s: %w", accountID, u.Day.Format(time.DateOnly), err)
	}
	u.UpdatedAt = fromMillis(at)
	return u, nil
}

// AddModelUsage adds add's requests and tokens to the usage of
// add.AccountID on the UTC day of add.Day and returns the day's totals
// afterwards. It is one statement, so concurrent additions from any
// number of nodes all count. A negative or absurd count is ErrInvalid; an
// account that does not exist is ErrNotFound.
func (q *Queries) AddModelUsage(ctx context.Context, add ModelUsage) (ModelUsage, error) {
	for _, n := range []int64{add.Requests, add.InputTokens, add.OutputTokens} {
		if n < 0 || n > maxUsageAdd {
			return ModelUsage{}, fmt.Errorf("add model usage of %s: %w: count %d", add.AccountID, ErrInvalid, n)
		}
	}
	u := ModelUsage{AccountID: add.AccountID, Day: UTCDay(add.Day)}
	var at int64
	err := q.writeQueryRow(ctx, `INSERT INTO model_usage (account_id, day, requests, input_tokens, output_tokens, updated_at)
		VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (account_id, day) DO UPDATE SET requests = model_usage.requests + excluded.requests,
			input_tokens = model_usage.input_tokens + excluded.input_tokens,
			output_tokens = model_usage.output_tokens + excluded.output_tokens,
			updated_at = excluded.updated_at
		RETURNING requests, input_tokens, output_tokens, updated_at`,
		u.AccountID, toMillis(u.Day), add.Requests, add.InputTokens, add.OutputTokens, toMillis(nowMS())).
		Scan(&u.Requests, &u.InputTokens, &u.OutputTokens, &at)
	if err != nil {
		return ModelUsage{}, fmt.Errorf("add model usage of %s on %s: %w", u.AccountID, u.Day.Format(time.DateOnly), mapErr(err))
	}
	u.UpdatedAt = fromMillis(at)
	return u, nil
}
