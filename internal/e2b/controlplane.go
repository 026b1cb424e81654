package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/errdefs"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// envName is an environment variable's name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// maxBody bounds a control-plane request body.
const maxBody = 1 << 20

// listLimit bounds one page of a list.
const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

// apiError is an answer in E2B's error shape, {"code", "message"}: the SDKs
// read code (404 makes kill() return false, 409 makes pause() return
// false).
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	// FailureReason says why a sandbox that failed did (sandboxd): its
	// routes answer 404, as E2B does for a sandbox that ended, with the
	// reason the REST API's failureReason gives.
	FailureReason string `json:"failureReason,omitempty"`
}

func (e *apiError) Error() string { return e.Message }

func errorf(code int, format string, args ...any) *apiError {
	return &apiError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// errorFor maps the manager's and the store's errors to E2B's codes.
func errorFor(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, store.ErrNotFound), errors.Is(err, errdefs.ErrNotFound):
		return &apiError{Code: http.StatusNotFound, Message: err.Error()}
	case errors.Is(err, errdefs.ErrInvalid):
		return &apiError{Code: http.StatusBadRequest, Message: err.Error()}
	case errors.Is(err, errdefs.ErrQuota):
		return &apiError{Code: http.StatusTooManyRequests, Message: err.Error()}
	case errors.Is(err, errdefs.ErrForbidden), errors.Is(err, auth.ErrScope):
		return &apiError{Code: http.StatusForbidden, Message: err.Error()}
	case errors.Is(err, errdefs.ErrNotRunning):
		return &apiError{Code: http.StatusConflict, Message: err.Error()}
	}
	return &apiError{Code: http.StatusInternalServerError, Message: "internal error"}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// handler is a control-plane route: it acts for p.
type handler func(w http.ResponseWriter, r *http.Request, p auth.Principal) error

func (a *API) controlPlane() http.Handler {
	r := chi.NewRouter()
	for _, prefix := range []string{"", "/v2"} {
		r.Post(prefix+"/sandboxes", a.route(a.create, true))
		r.Get(prefix+"/sandboxes", a.route(a.list, false))
		r.Post(prefix+"/sandboxes/{id}/connect", a.route(a.connect, true))
	}
	r.Get("/sandboxes/{id}", a.route(a.get, false))
	r.Delete("/sandboxes/{id}", a.route(a.kill, true))
	r.Post("/sandboxes/{id}/timeout", a.route(a.setTimeout, true))
	r.Post("/sandboxes/{id}/refreshes", a.route(a.refresh, true))
	r.Post("/sandboxes/{id}/pause", a.route(a.pause, true))
	r.Post("/sandboxes/{id}/resume", a.route(a.resume, true))
	r.Post("/sandboxes/{id}/fork", a.route(a.fork, true))
	r.Put("/sandboxes/{id}/network", a.route(a.setNetwork, true))
	r.Get("/sandboxes/{id}/metrics", a.route(a.metrics, false))
	r.Get("/templates", a.route(a.templates, false))
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, errorf(http.StatusNotFound, "%s %s is not part of the E2B API sandboxd serves (see docs/E2B.md)", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusMethodNotAllowed, errorf(http.StatusMethodNotAllowed, "method %s not allowed on %s", r.Method, r.URL.Path))
	})
	return r
}

// route authenticates the caller's key (X-API-Key, or a Bearer token) and
// runs h; writes is set for routes that change something or start work,
// which a sandbox's own key may not use (auth's scope rule, as the REST
// API applies it).
func (a *API) route(h handler, writes bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := a.authenticate(r)
		if err == nil && writes && p.MayCall(http.MethodPost) != nil {
			err = errorf(http.StatusForbidden, "a sandbox's own key (RECOUP_API_KEY) may only read the API; %s %s needs an account key", r.Method, r.URL.Path)
		}
		// In a cluster, a sandbox another node hosts is acted on there.
		if c := a.opts.Cluster; err == nil && c != nil && !api.ViaCluster(r) {
			if id := chi.URLParam(r, "id"); id != "" {
				if node, ok := c.HostOf(r.Context(), sandboxID(id)); ok {
					c.Forward(w, r, node, p.KeyID, false)
					return
				}
			}
		}
		if err == nil {
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
			err = h(w, r, p)
		}
		if err != nil {
			ae := errorFor(err)
			if ae.Code >= 500 {
				a.log.ErrorContext(r.Context(), "e2b api", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeJSON(w, ae.Code, ae)
		}
	}
}

// authenticate resolves the caller's key. E2B's SDKs send it in
// X-API-Key; an Authorization header may carry a Bearer key instead, but
// never beside it (auth.KeyFromHeaders).
func (a *API) authenticate(r *http.Request) (auth.Principal, error) {
	if api.ViaCluster(r) {
		// Forwarded by another node, which authenticated the key: the
		// signature names it by its id.
		if a.opts.Cluster == nil {
			return auth.Principal{}, errorf(http.StatusUnauthorized, "not part of a cluster")
		}
		keyID, _, err := a.opts.Cluster.Forwarded(r)
		if err != nil {
			a.log.WarnContext(r.Context(), "refused a request on the cluster listener", "err", err, "remote", r.RemoteAddr)
			return auth.Principal{}, errorf(http.StatusUnauthorized, "Invalid API key")
		}
		p, err := a.opts.Auth.AuthenticateKeyID(r.Context(), keyID)
		if err != nil {
			return auth.Principal{}, errorf(http.StatusUnauthorized, "Invalid API key")
		}
		return p, nil
	}
	key, err := auth.KeyFromHeaders(r.Header)
	if err != nil {
		return auth.Principal{}, errorf(http.StatusUnauthorized, "Invalid API key: send a sandboxd API key in X-API-Key")
	}
	p, err := a.opts.Auth.Authenticate(r.Context(), key)
	if err != nil {
		return auth.Principal{}, errorf(http.StatusUnauthorized, "Invalid API key")
	}
	return p, nil
}

// decode reads a JSON body into v; an empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	_, err := decodeRaw(r, v)
	return err
}

// decodeRaw is decode that also returns the body read.
func decodeRaw(r *http.Request, v any) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, errorf(http.StatusRequestEntityTooLarge, "request body over %d bytes", mbe.Limit)
		}
		return nil, errorf(http.StatusBadRequest, "read request body: %v", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return b, nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return nil, errorf(http.StatusBadRequest, "request body: %v", err)
	}
	return b, nil
}

// newSandboxRequest is NewSandbox and NewSandboxV2.
type newSandboxRequest struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"` // seconds
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
}

// networkConfig is the part of E2B's SandboxNetworkConfig sandboxd's
// policy expresses.
type networkConfig struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// AllowPublicTraffic false puts the sandbox's ports behind a traffic
	// token (create only).
	AllowPublicTraffic *bool `json:"allowPublicTraffic"`
}

// sandboxResponse is E2B's Sandbox: what create, resume and connect answer.
type sandboxResponse struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
	Alias              string  `json:"alias,omitempty"`
}

// listedSandbox is E2B's ListedSandbox; sandboxDetail adds to it.
type listedSandbox struct {
	SandboxID   string            `json:"sandboxID"`
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int               `json:"memoryMB"`
	DiskSizeMB  int               `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

type sandboxDetail struct {
	listedSandbox
	// EnvdAccessToken is given to account keys only: with it, anyone runs
	// commands in the sandbox as root.
	EnvdAccessToken string    `json:"envdAccessToken,omitempty"`
	Domain          *string   `json:"domain"`
	Lifecycle       lifecycle `json:"lifecycle"`
}

// lifecycle is E2B's SandboxLifecycle: what the timeout does.
type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"` // "kill" or "pause"
}

func lifecycleOf(sb store.Sandbox) lifecycle {
	if sb.OnTimeout == store.OnTimeoutPause {
		return lifecycle{OnTimeout: "pause"}
	}
	return lifecycle{OnTimeout: "kill"}
}

// clientID is a fixed value: E2B's is an internal routing detail that the
// SDKs carry but do not use.
const clientID = "sandboxd"

func (a *API) create(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req newSandboxRequest
	raw, err := decodeRaw(r, &req)
	if err != nil {
		return err
	}
	if req.TemplateID == "" {
		req.TemplateID = DefaultTemplate
	}
	if req.TemplateID != DefaultTemplate && !slices.Contains(a.opts.Templates, req.TemplateID) {
		return errorf(http.StatusNotFound, "template %q not found: this server starts %s", req.TemplateID, strings.Join(append([]string{DefaultTemplate}, a.opts.Templates...), ", "))
	}
	if len(req.EnvVars) > 256 {
		return errorf(http.StatusBadRequest, "envVars: at most 256 variables")
	}
	for k, v := range req.EnvVars {
		if !envName.MatchString(k) || len(v) > 32<<10 {
			return errorf(http.StatusBadRequest, "envVars: %q: names are letters, digits and _, not starting with a digit; values at most 32 KiB", k)
		}
	}
	if req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
		return errorf(http.StatusBadRequest, "autoPauseMemory false is not supported: sandboxd pauses a sandbox with its memory")
	}
	for k, v := range req.Metadata {
		if len(k) == 0 || len(k) > 256 || len(v) > 4096 {
			return errorf(http.StatusBadRequest, "metadata: keys of 1 to 256 bytes and values of at most 4096 bytes")
		}
	}
	if len(req.Metadata) > 64 {
		return errorf(http.StatusBadRequest, "metadata: at most 64 entries")
	}
	creq := sandbox.CreateRequest{}
	if req.AutoPause != nil && *req.AutoPause {
		creq.OnTimeout = store.OnTimeoutPause
	}
	if req.Timeout != nil {
		if creq.Lifetime, err = a.seconds("timeout", *req.Timeout); err != nil {
			return err
		}
	}
	policy, err := req.policy()
	if err != nil {
		return err
	}
	creq.Network = policy
	if c := a.opts.Cluster; c != nil && !api.ViaCluster(r) {
		// Placed like the API's creates: best of K healthy nodes.
		node, local, err := c.Place(r.Context(), policy)
		if err != nil {
			return err
		}
		if !local {
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(raw)), int64(len(raw))
			c.Forward(w, r, node, p.KeyID, true)
			return nil
		}
	}
	token, err := newAccessToken()
	if err != nil {
		return err
	}
	sb, _, err := a.opts.Sandboxes.Create(r.Context(), p.AccountID, creq)
	if err != nil {
		return err
	}
	e := store.E2BSandbox{SandboxID: sb.ID, AccountID: p.AccountID, TemplateID: req.TemplateID, Metadata: req.Metadata, EnvVars: req.EnvVars, AccessToken: token, CreatedAt: a.opts.Now()}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic {
		if e.TrafficToken, err = newAccessToken(); err != nil {
			return err
		}
	}
	if err := a.opts.Store.CreateE2BSandbox(context.WithoutCancel(r.Context()), e); err != nil {
		// Without its record the sandbox cannot be reached through this API.
		_, _ = a.opts.Sandboxes.Stop(context.WithoutCancel(r.Context()), p, sb.ID)
		return err
	}
	writeJSON(w, http.StatusCreated, a.sandboxResponse(e))
	return nil
}

// policy maps E2B's network options onto sandboxd's policy: no options is
// the server's default, allow_internet_access false is no network, and
// allowOut lists what may be reached. denyOut is refused: sandboxd's deny
// list is the operator's, always applied, and a policy is an allow list.
func (req newSandboxRequest) policy() (*netpol.Policy, error) {
	return policyOf(req.AllowInternetAccess, req.Network)
}

// policyOf maps E2B's network options onto a policy; nil when they say
// nothing.
func policyOf(allowInternet *bool, n *networkConfig) (*netpol.Policy, error) {
	if n != nil && len(n.DenyOut) > 0 {
		return nil, errorf(http.StatusBadRequest, "network.denyOut is not supported: sandboxd's policies are allow lists (network.allowOut), and private, host and metadata addresses are always denied")
	}
	if allowInternet != nil && !*allowInternet {
		if n != nil && len(n.AllowOut) > 0 {
			return nil, errorf(http.StatusBadRequest, "allow_internet_access false with network.allowOut: choose one")
		}
		p := netpol.Policy{Mode: netpol.ModeNone}
		return &p, nil
	}
	if n != nil && len(n.AllowOut) > 0 {
		b, err := json.Marshal(map[string][]string{"allow": n.AllowOut})
		if err != nil {
			return nil, err
		}
		var p netpol.Policy
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, errorf(http.StatusBadRequest, "network.allowOut: %v", err)
		}
		return &p, nil
	}
	if allowInternet != nil && *allowInternet {
		p := netpol.Policy{Mode: netpol.ModeEgress}
		return &p, nil
	}
	return nil, nil
}

// networkUpdate is E2B's SandboxNetworkUpdateConfig.
type networkUpdate struct {
	networkConfig
	AllowInternetAccess *bool `json:"allow_internet_access"`
}

// setNetwork replaces a running sandbox's policy (PUT
// /sandboxes/{id}/network); what the body omits is cleared, so an empty
// one is E2B's default, the internet.
func (a *API) setNetwork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
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
	sb, _, err := a.sandboxOf(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if _, err := a.opts.Sandboxes.SetNetwork(r.Context(), p, sb.ID, *policy); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkResult is E2B's SandboxForkResult.
type forkResult struct {
	Sandbox *sandboxResponse `json:"sandbox,omitempty"`
	Error   *apiError        `json:"error,omitempty"`
}

// fork starts count sandboxes (default 1) from a running sandbox's memory
// and filesystem, all or none; each child is the parent's template,
// metadata and environment with its own access token.
func (a *API) fork(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
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
	parent, e, err := a.sandboxOf(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	children, err := a.opts.Sandboxes.Fork(r.Context(), p, parent.ID, count, lifetime)
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
		_, _ = a.opts.Sandboxes.Stop(ctx, p, child.ID)
		out = append(out, forkResult{Error: &apiError{Code: http.StatusInternalServerError, Message: "the fork started but could not be recorded"}})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// newAccessToken returns a sandbox's envd access token: 32 random bytes.
func newAccessToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate access token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

func (a *API) sandboxResponse(e store.E2BSandbox) sandboxResponse {
	r := sandboxResponse{SandboxID: e2bID(e.SandboxID), TemplateID: e.TemplateID, ClientID: clientID, EnvdVersion: EnvdVersion, EnvdAccessToken: e.AccessToken}
	if a.opts.Domain != "" {
		r.Domain = &a.opts.Domain
	}
	if e.TrafficToken != "" {
		r.TrafficAccessToken = &e.TrafficToken
	}
	return r
}

// sandboxOf returns live sandbox id with its E2B record when the caller may
// act for its account (auth.MayActFor, the one access rule of every front
// end): a sandbox of an account it may not act for, one this API did not
// create and one that ended are all not found, as E2B answers for a killed
// sandbox. Not found, never a state of its own: the SDKs know only running
// and paused (a "failed" state fails their parsing), and read 404 as
// ended. One that failed says why in the 404 (failedError).
func (a *API) sandboxOf(ctx context.Context, p auth.Principal, id string) (store.Sandbox, store.E2BSandbox, error) {
	notFound := errorf(http.StatusNotFound, "sandbox %q not found", id)
	id = sandboxID(id)
	e, err := a.opts.Store.GetE2BSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Sandbox{}, store.E2BSandbox{}, notFound
	}
	if err != nil {
		return store.Sandbox{}, store.E2BSandbox{}, err
	}
	if ok, err := a.opts.Auth.MayActFor(ctx, p, e.AccountID); err != nil || !ok {
		if err == nil {
			err = notFound
		}
		return store.Sandbox{}, store.E2BSandbox{}, err
	}
	sb, err := a.opts.Store.GetSandbox(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Sandbox{}, store.E2BSandbox{}, notFound
	}
	if err != nil {
		return store.Sandbox{}, store.E2BSandbox{}, err
	}
	if sb = a.opts.Sandboxes.Live(ctx, []store.Sandbox{sb})[0]; !live(sb) {
		if sb.Status == store.SandboxFailed {
			return store.Sandbox{}, store.E2BSandbox{}, failedError(sb)
		}
		return store.Sandbox{}, store.E2BSandbox{}, notFound
	}
	return sb, e, nil
}

// failedError is the 404 of a sandbox that failed: the SDKs raise their
// not-found error with its message, which says why, as failureReason does.
func failedError(sb store.Sandbox) *apiError {
	reason := sb.FailureReason
	if reason == "" {
		reason = "no reason was recorded"
	}
	return &apiError{Code: http.StatusNotFound, Message: fmt.Sprintf("sandbox %q failed: %s", e2bID(sb.ID), reason), FailureReason: sb.FailureReason}
}

// live reports whether a sandbox is still E2B's "running" or "paused".
func live(sb store.Sandbox) bool {
	return sb.Status == store.SandboxPending || sb.Status == store.SandboxRunning
}

// state is E2B's name for where a live sandbox is.
func state(sb store.Sandbox) string {
	if sb.Pause != "" {
		return "paused"
	}
	return "running"
}

func (a *API) listed(sb store.Sandbox, e store.E2BSandbox) listedSandbox {
	meta := e.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	end := sb.Deadline
	if sb.Pause != "" {
		end = a.opts.Now().Add(sb.PausedRemaining)
	}
	return listedSandbox{
		SandboxID: e2bID(sb.ID), TemplateID: e.TemplateID, ClientID: clientID,
		StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(),
		CPUCount: a.opts.CPUs, MemoryMB: a.opts.MemoryMB, DiskSizeMB: a.opts.DiskMB,
		Metadata: meta, State: state(sb), EnvdVersion: EnvdVersion,
	}
}

func (a *API) get(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, e, err := a.sandboxOf(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	d := sandboxDetail{listedSandbox: a.listed(sb, e), Lifecycle: lifecycleOf(sb)}
	if p.Scope() == auth.ScopeFull {
		// A sandbox's key reads, never acts: the token would let it run
		// commands as root in this sandbox, whatever its own scope says.
		d.EnvdAccessToken = e.AccessToken
	}
	if a.opts.Domain != "" {
		d.Domain = &a.opts.Domain
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

// list answers both GET /sandboxes (v1: running ones, filtered by
// metadata) and GET /v2/sandboxes (state, metadata, limit and nextToken,
// the next page's token in the x-next-token header). It reads the
// account's live sandboxes from the store, which selects them by their
// status: an account's ended sandboxes, however many, never push a live
// one out of the list. A token is the place of the last sandbox of a page
// (store.Cursor): pages neither repeat nor skip a sandbox when others
// start or end between two requests.
func (a *API) list(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	q := r.URL.Query()
	v2 := strings.HasPrefix(r.URL.Path, "/v2/")
	meta, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		return err
	}
	states := map[string]bool{"running": true, "paused": v2}
	if s := q.Get("state"); s != "" {
		states = map[string]bool{}
		for _, st := range strings.Split(s, ",") {
			if st != "running" && st != "paused" {
				return errorf(http.StatusBadRequest, "state %q: want running or paused", st)
			}
			states[st] = true
		}
	}
	limit := defaultListLimit
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > maxListLimit {
			return errorf(http.StatusBadRequest, "limit must be 1 to %d", maxListLimit)
		}
	}
	var after store.Cursor
	if s := q.Get("nextToken"); s != "" {
		if after, err = store.ParseCursor(s); err != nil {
			return errorf(http.StatusBadRequest, "nextToken is not one this server gave")
		}
	}
	most := 0 // v1 lists them all
	if v2 {
		most = limit + 1 // one more than a page says whether another follows
	}
	found, err := a.liveSandboxes(r.Context(), p.AccountID, after, most, meta, states)
	if err != nil {
		return err
	}
	if v2 && len(found) > limit {
		found = found[:limit]
		w.Header().Set("X-Next-Token", found[limit-1].e.Cursor().String())
	}
	page := make([]listedSandbox, len(found))
	for i, f := range found {
		page[i] = a.listed(f.sb, f.e)
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// listBatch is how many live sandboxes list reads from the store at once.
const listBatch = 200

// liveSandbox is a sandbox list shows, with its E2B record.
type liveSandbox struct {
	sb store.Sandbox
	e  store.E2BSandbox
}

// liveSandboxes returns the live sandboxes of accountID past after, newest
// first, whose metadata has meta and whose state is one of states: at
// most most of them (0: all).
func (a *API) liveSandboxes(ctx context.Context, accountID string, after store.Cursor, most int, meta map[string]string, states map[string]bool) ([]liveSandbox, error) {
	var out []liveSandbox
	for {
		records, err := a.opts.Store.ListLiveE2BSandboxes(ctx, accountID, after, listBatch)
		if err != nil {
			return nil, err
		}
		if len(records) == 0 {
			return out, nil
		}
		last := len(records) < listBatch
		after = records[len(records)-1].Cursor()
		records = slices.DeleteFunc(records, func(e store.E2BSandbox) bool { return !matches(e.Metadata, meta) })
		ids := make([]string, len(records))
		for i, e := range records {
			ids[i] = e.SandboxID
		}
		rows, err := a.opts.Store.ListSandboxesByID(ctx, ids)
		if err != nil {
			return nil, err
		}
		byID := make(map[string]store.Sandbox, len(rows))
		for _, sb := range a.opts.Sandboxes.Live(ctx, rows) {
			byID[sb.ID] = sb
		}
		for _, e := range records { // newest first
			sb, ok := byID[e.SandboxID]
			if !ok || !live(sb) || !states[state(sb)] {
				continue // ended (or gone) meanwhile, or another state
			}
			out = append(out, liveSandbox{sb: sb, e: e})
			if most > 0 && len(out) == most {
				return out, nil
			}
		}
		if last {
			return out, nil
		}
	}
}

// metadataFilter parses the SDKs' metadata query: a URL-encoded query
// string of key=value pairs, each part encoded once more.
func metadataFilter(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(s)
	if err != nil {
		return nil, errorf(http.StatusBadRequest, "metadata filter: %v", err)
	}
	out := make(map[string]string, len(vals))
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[len(vs)-1])
		if err1 != nil || err2 != nil {
			return nil, errorf(http.StatusBadRequest, "metadata filter: bad encoding")
		}
		out[key] = val
	}
	return out, nil
}

func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func (a *API) kill(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, _, err := a.sandboxOf(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if _, err := a.opts.Sandboxes.Stop(r.Context(), p, sb.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// timeoutRequest is E2B's {"timeout": seconds}.
type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

// duration is the request's timeout; a will bound it.
func (a *API) duration(t timeoutRequest) (time.Duration, error) {
	if t.Timeout == nil {
		return 0, errorf(http.StatusBadRequest, "timeout must be a positive number of seconds")
	}
	return a.seconds("timeout", *t.Timeout)
}

// maxSeconds is the most seconds a time.Duration holds: beyond it, n *
// time.Second wraps around (18446744074 s became 0.29 s, 9223372037 s a
// negative lifetime that meant the default).
const maxSeconds = math.MaxInt64 / int64(time.Second)

// seconds is field's value n, a number of seconds, as a duration: 400 when
// it is not positive or no duration can hold it. The manager bounds a
// lifetime by the server's maximum again (Options.MaxTimeout says it in
// seconds first).
func (a *API) seconds(field string, n int64) (time.Duration, error) {
	most := maxSeconds
	if a.opts.MaxTimeout > 0 {
		most = int64(a.opts.MaxTimeout / time.Second)
	}
	if n <= 0 || n > most {
		return 0, errorf(http.StatusBadRequest, "%s must be a positive number of seconds, at most %d", field, most)
	}
	return time.Duration(n) * time.Second, nil
}

func (a *API) setTimeout(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req timeoutRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	return a.extend(w, r, p, req)
}

// refresh is the older SDKs' keep-alive: {"duration": seconds} more.
func (a *API) refresh(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	var req struct {
		Duration *int64 `json:"duration"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	return a.extend(w, r, p, timeoutRequest{Timeout: req.Duration})
}

// extend gives the sandbox of the request's path the lifetime req asks
// for, from now.
func (a *API) extend(w http.ResponseWriter, r *http.Request, p auth.Principal, req timeoutRequest) error {
	d, err := a.duration(req)
	if err != nil {
		return err
	}
	sb, _, err := a.sandboxOf(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if _, err := a.opts.Sandboxes.SetTimeout(r.Context(), p, sb.ID, d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) pause(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	sb, _, err := a.sandboxOf(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	if sb.Pause != "" {
		return errorf(http.StatusConflict, "sandbox %s is already paused", e2bID(sb.ID))
	}
	if _, err := a.opts.Sandboxes.Pause(r.Context(), p, sb.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resume is v1's POST /sandboxes/{id}/resume: a running sandbox is a
// conflict.
func (a *API) resume(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	return a.connectOrResume(w, r, p, true)
}

// connect resumes a paused sandbox (201) or answers a running one (200),
// setting its timeout when the request gives one.
func (a *API) connect(w http.ResponseWriter, r *http.Request, p auth.Principal) error {
	return a.connectOrResume(w, r, p, false)
}

func (a *API) connectOrResume(w http.ResponseWriter, r *http.Request, p auth.Principal, onlyPaused bool) error {
	var req timeoutRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	sb, e, err := a.sandboxOf(r.Context(), p, chi.URLParam(r, "id"))
	if err != nil {
		return err
	}
	code := http.StatusOK
	switch {
	case sb.Pause != "":
		code = http.StatusCreated
	case onlyPaused:
		return errorf(http.StatusConflict, "sandbox %s is already running", e2bID(sb.ID))
	}
	if err := a.wake(r.Context(), p, sb, req); err != nil {
		return err
	}
	writeJSON(w, code, a.sandboxResponse(e))
	return nil
}

// wake resumes sb if it is paused and gives it the timeout req asks for:
// a resumed sandbox gets it whole, a running one only when it extends its
// life (E2B's connect never shortens a running sandbox's).
func (a *API) wake(ctx context.Context, p auth.Principal, sb store.Sandbox, req timeoutRequest) error {
	var d time.Duration
	if req.Timeout != nil {
		var err error
		if d, err = a.duration(req); err != nil {
			return err
		}
	}
	running := sb.Pause == ""
	if !running {
		var err error
		if sb, err = a.opts.Sandboxes.Resume(ctx, p, sb.ID); err != nil {
			return err
		}
	}
	if d == 0 || (running && sb.Deadline.After(a.opts.Now().Add(d))) {
		return nil
	}
	_, err := a.opts.Sandboxes.SetTimeout(ctx, p, sb.ID, d)
	return err
}

// template is the part of E2B's Template the SDKs read when listing.
type template struct {
	TemplateID string   `json:"templateID"`
	Aliases    []string `json:"aliases"`
	Public     bool     `json:"public"`
	CPUCount   int      `json:"cpuCount"`
	MemoryMB   int      `json:"memoryMB"`
	DiskSizeMB int      `json:"diskSizeMB"`
	EnvdVer    string   `json:"envdVersion"`
}

func (a *API) templates(w http.ResponseWriter, _ *http.Request, _ auth.Principal) error {
	out := []template{}
	for _, id := range append([]string{DefaultTemplate}, a.opts.Templates...) {
		out = append(out, template{TemplateID: id, Aliases: []string{id}, Public: true, CPUCount: a.opts.CPUs, MemoryMB: a.opts.MemoryMB, DiskSizeMB: a.opts.DiskMB, EnvdVer: EnvdVersion})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
