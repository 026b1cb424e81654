package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
)

// ModelUsageService reports what an account used today of the operator's
// model providers through the model proxy, and its daily budgets
// (internal/modelproxy).
type ModelUsageService interface {
	Usage(ctx context.Context, accountID string) (modelproxy.AccountUsage, error)
}

// ModelUsageResponse answers GET /api/model/usage: the account's model
// proxy use today (UTC, every node's) against its daily budgets.
type ModelUsageResponse struct {
	Status string `json:"status" jsonschema:"enum=success"`
	// Day is today in UTC; the counts are of it.
	Day          string `json:"day" jsonschema:"format=date"`
	Requests     int64  `json:"requests" jsonschema:"description=Requests forwarded to a model provider today"`
	Tokens       int64  `json:"tokens" jsonschema:"description=input_tokens plus output_tokens: what the token budget counts"`
	InputTokens  int64  `json:"input_tokens" jsonschema:"description=Prompt tokens the providers reported (cache writes and reads included)"`
	OutputTokens int64  `json:"output_tokens" jsonschema:"description=Generated tokens the providers reported"`
	// The budgets: null when unlimited.
	RequestsBudget *int64 `json:"requests_budget" jsonschema:"nullable,description=Requests per account and UTC day; null: unlimited"`
	TokensBudget   *int64 `json:"tokens_budget" jsonschema:"nullable,description=Tokens per account and UTC day; null: unlimited"`
	ResetsAt       string `json:"resets_at" jsonschema:"format=date-time,description=When the counts start again from zero (the next UTC midnight)"`
}

// modelUsage answers the account's model usage today. A sandbox's key may
// read its own account's: the code inside can see how much is left
// before it is refused.
func (s *Server) modelUsage(w http.ResponseWriter, r *http.Request) error {
	requested, err := contract.QueryAccountID(r.URL.Query())
	if err != nil {
		return err
	}
	account, err := s.actFor(r, requested)
	if err != nil {
		return err
	}
	if s.opts.ModelUsage == nil {
		return errNotAvailable
	}
	u, err := s.opts.ModelUsage.Usage(r.Context(), account)
	if err != nil {
		return fmt.Errorf("model usage of %s: %w", account, err)
	}
	writeJSON(w, http.StatusOK, ModelUsageResponse{
		Status:         "success",
		Day:            u.Day.UTC().Format(time.DateOnly),
		Requests:       u.Requests,
		Tokens:         u.Tokens(),
		InputTokens:    u.InputTokens,
		OutputTokens:   u.OutputTokens,
		RequestsBudget: budget(u.Budgets.RequestsPerDay),
		TokensBudget:   budget(u.Budgets.TokensPerDay),
		ResetsAt:       contract.FormatTime(u.ResetsAt),
	})
	return nil
}

// budget is a daily budget as the API shows it: null when unlimited.
func budget(n int64) *int64 {
	if n <= 0 {
		return nil
	}
	return &n
}
