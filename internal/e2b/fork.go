package e2b

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// networkUpdate is E2B's SandboxNetworkUpdateConfig.
type networkUpdate struct {
	networkConfig
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

// setNetwork replaces a running sandbox's policy (PUT
// /sandboxes/{id}/network); what the body omits is cleared, so an empty
// one is E2B's default, the internet.
func (a *API) setNetwork(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req networkUpdate
	if err := decode(r, &req); err != nil {
		return err
	}
	policy, err := policyOf(req.AllowInternetAccess, &req.networkConfig)
	if err != nil {
		return err
	}
	if policy == nil {
		policy = &netpol.Policy{Mode: netpol.ModeEgress}
	}
	sb, _, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if _, err := a.opts.Sandboxes.SetNetwork(r.Context(), c.Principal, sb.ID, *policy); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkResult is E2B's SandboxForkResult.
type forkResult struct {
	Sandbox *sandboxResponse `json:"sandbox,omitempty"`
	Error   *envd.Error      `json:"error,omitempty"`
}

// fork starts count sandboxes (default 1) from a running sandbox's memory
// and filesystem, all or none; each child is the parent's template,
// metadata and environment with its own access token.
func (a *API) fork(w http.ResponseWriter, r *http.Request, c edge.Caller) error {
	var req struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	var lifetime time.Duration
	if req.Timeout != nil {
		d, err := a.duration(timeoutRequest{Timeout: req.Timeout})
		if err != nil {
			return err
		}
		lifetime = d
	}
	parent, e, err := a.sandboxOf(r.Context(), c, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	children, err := a.opts.Sandboxes.Fork(r.Context(), c.Principal, parent.ID, count, lifetime)
	if err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context())
	out := make([]forkResult, 0, len(children))
	for _, child := range children {
		token, err := newAccessToken()
		if err == nil {
			ce := store.E2BSandbox{SandboxID: child.ID, AccountID: child.AccountID, TemplateID: e.TemplateID, Metadata: e.Metadata, EnvVars: e.EnvVars, AccessToken: token, CreatedAt: a.opts.Now()}
			if e.TrafficToken != "" {
				ce.TrafficToken, err = newAccessToken()
			}
			if err == nil {
				err = a.opts.Store.CreateE2BSandbox(ctx, ce)
			}
			if err == nil {
				resp := a.sandboxResponse(ce)
				out = append(out, forkResult{Sandbox: &resp})
				continue
			}
		}
		// A child that cannot be reached through this API is no use: it
		// is stopped and reported as failed, as E2B reports one fork.
		a.log.ErrorContext(ctx, "e2b fork: record a child", "sandbox_id", child.ID, "err", err)
		_, _ = a.opts.Sandboxes.Stop(ctx, c.Principal, child.ID)
		out = append(out, forkResult{Error: &envd.Error{Code: http.StatusInternalServerError, Message: "the fork started but could not be recorded"}})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}
