// Package modelproxy gives the code inside sandboxes the model APIs without
// their keys. The agent CLIs in a sandbox (Claude Code, OpenCode) are
// pointed at http://sandboxd.internal/model/<provider>/... and given the
// sandbox's own key (RECOUP_API_KEY) as their API key; the proxy checks
// that key, replaces it with the operator's real credential and forwards
// the request to the provider, streaming the answer (Server-Sent Events
// included) back as it comes.
//
// Invariants:
//   - The operator's credential exists only in this process: it is never
//     in a sandbox's environment, files or processes, and never in a reply.
//   - Only live sandbox keys are accepted (a revoked key — its sandbox
//     ended — is 401; an account key is 403): the proxy is the sandboxes'
//     way to the model, not a public relay of the operator's key.
//   - Only inference endpoints are forwarded (endpointsOf): a provider's
//     files, batches, stored completions, organization and the like are
//     shared by every tenant holding the operator's key, so a sandbox
//     reaches none of them (403). A path is matched as sent, never
//     cleaned: any other spelling is refused. A chat completion is never
//     stored by the provider (store: false is forced).
//   - Request bodies are bounded; the caller's credential headers, cookies,
//     encodings and hop-by-hop headers never reach the provider.
//   - Every request is metered per account: requests, bytes in and out, and
//     the tokens the provider reports, in a JSON answer or a stream. With
//     a usage store, each account's requests and tokens are counted per
//     UTC day in the database (shared by a cluster's nodes) and held to
//     daily budgets: a request of an account at a budget is refused with
//     429 before it is forwarded.
package modelproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/httprec"
)

// PathPrefix is where the proxy is mounted; a provider's API is under
// PathPrefix + name + "/".
const PathPrefix = "/model/"

// SandboxURL is the proxy as sandboxes reach it; a provider's API is under
// SandboxURL + its name ("anthropic", "openai").
const SandboxURL = "http://sandboxd.internal" + PathPrefix

// Provider names.
const (
	Anthropic = "anthropic" // the Messages API, for Claude Code
	OpenAI    = "openai"    // an OpenAI-compatible API, for OpenCode
)

// DefaultMaxBody bounds a request body (a long conversation with a coding
// agent stays far below it).
const DefaultMaxBody = 32 << 20

// Upstream is one provider's real API and its credential.
type Upstream struct {
	// BaseURL is the provider's API base; a request for
	// /model/<name>/<rest> goes to BaseURL/<rest>.
	BaseURL string
	// APIKey is sent as x-api-key (Anthropic) or Authorization: Bearer
	// (OpenAI-compatible).
	APIKey string
	// BearerToken, for Anthropic only, is an OAuth token
	// (CLAUDE_CODE_OAUTH_TOKEN) sent as Authorization: Bearer when APIKey
	// is empty.
	BearerToken string
}

// configured: an Anthropic upstream needs a credential; an
// OpenAI-compatible one may need none (a local model server).
func (u Upstream) configured(name string) bool {
	return u.BaseURL != "" && (name == OpenAI || u.APIKey != "" || u.BearerToken != "")
}

// Authenticator checks a sandbox's key.
type Authenticator interface {
	Authenticate(ctx context.Context, plaintext string) (auth.Principal, error)
}

// Options configure a Proxy.
type Options struct {
	Auth Authenticator
	// Upstreams by provider name (Anthropic, OpenAI); a provider without
	// an entry (or without a credential) answers 404.
	Upstreams map[string]Upstream
	// MaxBody bounds request bodies (default DefaultMaxBody).
	MaxBody int64
	// Registry receives the metering counters; nil: not exported.
	Registry prometheus.Registerer
	// Transport reaches the providers (default http.DefaultTransport).
	Transport http.RoundTripper
	Logger    *slog.Logger
	// Usage counts each account's requests and tokens per UTC day; nil:
	// no count is kept and no budget holds.
	Usage UsageStore
	// Budgets bound each account's day (they need Usage).
	Budgets Budgets
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Proxy is the http.Handler mounted at PathPrefix.
type Proxy struct {
	opts      Options
	log       *slog.Logger
	upstreams map[string]*upstream
	m         meters
}

type upstream struct {
	Upstream
	name      string
	base      *url.URL
	endpoints []endpoint
	rp        *httputil.ReverseProxy
}

type meters struct {
	requests  *prometheus.CounterVec
	bytesIn   *prometheus.CounterVec
	bytesOut  *prometheus.CounterVec
	tokens    *prometheus.CounterVec
	forbidden *prometheus.CounterVec
	usage     *prometheus.GaugeVec
	budgets   *prometheus.GaugeVec
}

// New returns a Proxy.
func New(opts Options) (*Proxy, error) {
	if opts.Auth == nil {
		return nil, errors.New("modelproxy: an authenticator is required")
	}
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxBody
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Transport == nil {
		opts.Transport = http.DefaultTransport
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Usage == nil && (opts.Budgets.RequestsPerDay > 0 || opts.Budgets.TokensPerDay > 0) {
		return nil, errors.New("modelproxy: daily budgets need a usage store")
	}
	p := &Proxy{opts: opts, log: opts.Logger, upstreams: map[string]*upstream{}}
	p.m = meters{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_model_requests_total",
			Help: "Model proxy requests by account, provider and status code.",
		}, []string{"account", "provider", "status"}),
		bytesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_model_request_bytes_total",
			Help: "Bytes of request bodies sent to model providers, by account and provider.",
		}, []string{"account", "provider"}),
		bytesOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_model_response_bytes_total",
			Help: "Bytes of model provider answers returned to sandboxes, by account and provider.",
		}, []string{"account", "provider"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_model_tokens_total",
			Help: "Tokens the model providers reported using (JSON answers and streams), by account, provider and kind (input, with cache writes and reads; output).",
		}, []string{"account", "provider", "kind"}),
		forbidden: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_model_refused_total",
			Help: "Model proxy requests refused before reaching a provider, by reason (endpoint: not an inference endpoint; request_budget, token_budget: the account's daily budget is spent; ...).",
		}, []string{"reason"}),
		usage: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sandboxd_model_daily_usage",
			Help: "An account's model requests and tokens today (UTC, every node's), as this node last saw them, by account and kind (requests, tokens); compare with sandboxd_model_daily_budget.",
		}, []string{"account", "kind"}),
		budgets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sandboxd_model_daily_budget",
			Help: "Each account's daily model budget, by kind (requests, tokens); 0 is unlimited.",
		}, []string{"kind"}),
	}
	p.m.budgets.WithLabelValues("requests").Set(float64(opts.Budgets.RequestsPerDay))
	p.m.budgets.WithLabelValues("tokens").Set(float64(opts.Budgets.TokensPerDay))
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{p.m.requests, p.m.bytesIn, p.m.bytesOut, p.m.tokens, p.m.forbidden, p.m.usage, p.m.budgets} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("modelproxy: register metrics: %w", err)
			}
		}
	}
	for name, u := range opts.Upstreams {
		if name != Anthropic && name != OpenAI {
			return nil, fmt.Errorf("modelproxy: unknown provider %q", name)
		}
		if !u.configured(name) {
			continue
		}
		base, err := url.Parse(strings.TrimRight(u.BaseURL, "/"))
		if err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" || base.User != nil {
			return nil, fmt.Errorf("modelproxy: %s base URL must be an http(s) URL without credentials", name)
		}
		up := &upstream{Upstream: u, name: name, base: base, endpoints: endpointsOf(name)}
		up.rp = &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { up.rewrite(pr) },
			Transport: opts.Transport,
			// Stream: every chunk of an SSE answer is passed on at once.
			FlushInterval:  -1,
			ModifyResponse: p.modifyResponse,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				var tooBig *http.MaxBytesError
				if errors.As(err, &tooBig) {
					writeError(w, http.StatusRequestEntityTooLarge, p.tooLarge())
					return
				}
				p.log.Warn("model provider unreachable", "provider", name, "err", err)
				writeError(w, http.StatusBadGateway, "the model provider could not be reached")
			},
			ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
		}
		p.upstreams[name] = up
	}
	return p, nil
}

// Providers returns the names of the configured providers.
func (p *Proxy) Providers() []string {
	var names []string
	for _, n := range []string{Anthropic, OpenAI} {
		if _, ok := p.upstreams[n]; ok {
			names = append(names, n)
		}
	}
	return names
}

// ctxKey carries a request's metering from ServeHTTP to modifyResponse.
type ctxKey struct{}

// exchange is one request's metering: who it is for, and the scanner that
// reads its answer's usage (set once the answer's type is known).
type exchange struct {
	account, provider string
	scan              usageScanner
}

func (x *exchange) usage() usage {
	if x.scan == nil {
		return usage{}
	}
	return x.scan.usage()
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The path as sent: an escaped slash or dot must not turn into one.
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), PathPrefix)
	if !ok {
		writeError(w, http.StatusNotFound, "not found")
		return
	}
	name, path, _ := strings.Cut(rest, "/")
	up, ok := p.upstreams[name]
	if !ok {
		p.m.forbidden.WithLabelValues("unknown_provider").Inc()
		writeError(w, http.StatusNotFound, fmt.Sprintf("model provider %q is not configured on this server (configured: %s)", name, strings.Join(p.Providers(), ", ")))
		return
	}
	pr, ok := p.authenticate(w, r)
	if !ok {
		return
	}
	ep, path, ok := up.resolve(r.Method, path)
	if !ok {
		p.refuse(w, &refusal{status: http.StatusForbidden, reason: "endpoint",
			msg: fmt.Sprintf("the model proxy forwards only inference endpoints, and %s %s is not one of them; %s: %s",
				r.Method, r.URL.EscapedPath(), name, describe(up.endpoints))})
		return
	}
	if r.ContentLength > p.opts.MaxBody {
		p.refuse(w, &refusal{status: http.StatusRequestEntityTooLarge, reason: "too_large", msg: p.tooLarge()})
		return
	}
	start := p.opts.Now()
	f, err := p.checkBudgets(r.Context(), pr.AccountID, start)
	if err != nil {
		// Unchecked is unbounded: refuse rather than forward.
		p.log.Error("model proxy: check budgets", "err", err)
		writeError(w, http.StatusInternalServerError, "Internal server error")
		return
	}
	if f != nil {
		p.refuse(w, f)
		return
	}
	body, f := p.requestBody(w, r, ep)
	if f != nil {
		p.refuse(w, f)
		return
	}
	p.forward(w, r, forwarding{up: up, ep: ep, path: path, caller: pr, body: body, start: start})
}

// forwarding is a request the proxy forwards.
type forwarding struct {
	up     *upstream
	ep     endpoint
	path   string // relative to the provider's base URL
	caller auth.Principal
	body   *countingReader
	start  time.Time
}

// forward sends the request on, streams the answer back, and counts
// what it used.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, f forwarding) {
	x := &exchange{account: f.caller.AccountID, provider: f.up.name}
	out := r.Clone(context.WithValue(r.Context(), ctxKey{}, x))
	out.Body, out.ContentLength = f.body, f.body.size
	out.URL.Path, out.URL.RawPath = "/"+f.path, ""
	rec := &httprec.Recorder{ResponseWriter: w}
	// Deferred: the reverse proxy ends the handler with a panic
	// (http.ErrAbortHandler) when the caller goes away mid-answer, and
	// what the answer used until then counts all the same.
	defer func() {
		used := x.usage()
		p.record(r.Context(), x.account, f.start, used)
		status := rec.Status
		if status == 0 {
			status = http.StatusOK
		}
		p.meter(x, used, strconv.Itoa(status), f.body.n, rec.Bytes)
		p.log.Info("model request", "account_id", x.account, "sandbox_id", f.caller.SandboxID, "provider", x.provider,
			"endpoint", f.ep.method+" "+f.ep.path, "status", status, "bytes_in", f.body.n, "bytes_out", rec.Bytes,
			"input_tokens", used.input(), "output_tokens", used.output(), "elapsed", p.opts.Now().Sub(f.start))
	}()
	f.up.rp.ServeHTTP(rec, out)
}

// authenticate accepts a live sandbox key only; otherwise it has answered.
func (p *Proxy) authenticate(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	key, err := sandboxKey(r.Header)
	if err != nil {
		p.m.forbidden.WithLabelValues("credentials").Inc()
		writeError(w, http.StatusUnauthorized, err.Error())
		return auth.Principal{}, false
	}
	pr, err := p.opts.Auth.Authenticate(r.Context(), key)
	if err != nil {
		p.m.forbidden.WithLabelValues("unauthorized").Inc()
		if !errors.Is(err, auth.ErrUnauthorized) {
			p.log.Error("model proxy: authenticate", "err", err)
			writeError(w, http.StatusInternalServerError, "Internal server error")
			return auth.Principal{}, false
		}
		writeError(w, http.StatusUnauthorized, "Unauthorized")
		return auth.Principal{}, false
	}
	if pr.Scope() != auth.ScopeSandbox {
		p.m.forbidden.WithLabelValues("not_sandbox_key").Inc()
		writeError(w, http.StatusForbidden, "the model proxy serves sandboxes: authenticate with the sandbox's key (RECOUP_API_KEY)")
		return auth.Principal{}, false
	}
	return pr, true
}

// refuse answers a request the proxy does not forward, and counts it.
func (p *Proxy) refuse(w http.ResponseWriter, f *refusal) {
	p.m.forbidden.WithLabelValues(f.reason).Inc()
	f.write(w)
}

func (p *Proxy) tooLarge() string {
	return fmt.Sprintf("request body is larger than the model proxy's limit of %d bytes", p.opts.MaxBody)
}

// requestBody is the body to forward, bounded. An endpoint that rewrites
// its body gets it read whole first; any other body streams through.
func (p *Proxy) requestBody(w http.ResponseWriter, r *http.Request, ep endpoint) (*countingReader, *refusal) {
	limited := http.MaxBytesReader(w, r.Body, p.opts.MaxBody)
	if ep.rewrite == nil {
		return &countingReader{r: limited, size: r.ContentLength}, nil
	}
	raw, err := io.ReadAll(limited)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &refusal{status: http.StatusRequestEntityTooLarge, reason: "too_large", msg: p.tooLarge()}
		}
		return nil, &refusal{status: http.StatusBadRequest, reason: "bad_body", msg: "the request body could not be read"}
	}
	body, err := ep.rewrite(raw)
	if err != nil {
		return nil, &refusal{status: http.StatusBadRequest, reason: "bad_body", msg: fmt.Sprintf("%s %s: %v", ep.method, ep.path, err)}
	}
	return &countingReader{r: io.NopCloser(bytes.NewReader(body)), size: int64(len(body))}, nil
}

// meter counts a forwarded request in the metrics.
func (p *Proxy) meter(x *exchange, used usage, status string, in, out int64) {
	p.m.requests.WithLabelValues(x.account, x.provider, status).Inc()
	p.m.bytesIn.WithLabelValues(x.account, x.provider).Add(float64(in))
	p.m.bytesOut.WithLabelValues(x.account, x.provider).Add(float64(out))
	if n := used.input(); n > 0 {
		p.m.tokens.WithLabelValues(x.account, x.provider, "input").Add(float64(n))
	}
	if n := used.output(); n > 0 {
		p.m.tokens.WithLabelValues(x.account, x.provider, "output").Add(float64(n))
	}
}

// rewrite points the request at the provider and swaps the sandbox's
// credential for the operator's. Only the headers a model API needs are
// kept: the sandbox's key, cookies and forwarding headers go nowhere.
func (u *upstream) rewrite(pr *httputil.ProxyRequest) {
	in, out := pr.In, pr.Out
	target := *u.base
	target.Path = strings.TrimRight(u.base.Path, "/") + in.URL.Path
	target.RawPath = ""
	target.RawQuery = in.URL.RawQuery
	out.URL = &target
	out.Host = target.Host
	h := out.Header
	// Accept-Encoding too: an answer compressed at the caller's request
	// would pass the usage scanners unread; without it the transport asks
	// for gzip itself and decompresses.
	for _, k := range []string{"X-Api-Key", "Authorization", "Cookie", "Proxy-Authorization", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id", "Accept-Encoding"} {
		h.Del(k)
	}
	switch {
	case u.name == OpenAI:
		if u.APIKey != "" {
			h.Set("Authorization", "Bearer "+u.APIKey)
		}
	case u.APIKey != "":
		h.Set("X-Api-Key", u.APIKey)
	default:
		// An OAuth token of a Claude subscription is a bearer token; the
		// API wants its beta flag with it.
		h.Set("Authorization", "Bearer "+u.BearerToken)
		if !strings.Contains(h.Get("Anthropic-Beta"), oauthBeta) {
			if v := h.Get("Anthropic-Beta"); v != "" {
				h.Set("Anthropic-Beta", v+","+oauthBeta)
			} else {
				h.Set("Anthropic-Beta", oauthBeta)
			}
		}
	}
}

// oauthBeta is the flag the Anthropic API needs with OAuth tokens.
const oauthBeta = "oauth-2025-04-20"

// modifyResponse drops credentials the provider might set and reads the
// usage of JSON and streamed answers as they pass on.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	resp.Header.Del("Set-Cookie")
	x, _ := resp.Request.Context().Value(ctxKey{}).(*exchange)
	if x == nil || resp.Body == nil {
		return nil
	}
	if x.scan = scannerFor(resp.Header.Get("Content-Type")); x.scan != nil {
		resp.Body = &tap{rc: resp.Body, scan: x.scan}
	}
	return nil
}

// sandboxKey takes the caller's key from x-api-key or Authorization:
// Bearer, the two ways the CLIs send "their API key". Both at once must
// agree.
func sandboxKey(h http.Header) (string, error) {
	if len(h.Values("X-Api-Key")) > 1 || len(h.Values("Authorization")) > 1 {
		return "", errors.New("repeated credential header")
	}
	apiKey := strings.TrimSpace(h.Get("X-Api-Key"))
	var bearer string
	if authz := strings.TrimSpace(h.Get("Authorization")); authz != "" {
		scheme, token, ok := strings.Cut(authz, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
			return "", errors.New("the Authorization header must be a Bearer token")
		}
		bearer = strings.TrimSpace(token)
	}
	switch {
	case apiKey == "" && bearer == "":
		return "", errors.New("the sandbox's key (RECOUP_API_KEY) is required as x-api-key or Authorization: Bearer")
	case apiKey != "" && bearer != "" && apiKey != bearer:
		return "", errors.New("x-api-key and Authorization name different keys")
	case apiKey != "":
		return apiKey, nil
	}
	return bearer, nil
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"status": "error", "error": msg})
}

// countingReader counts the bytes of a body; size is its length, -1 when
// unknown.
type countingReader struct {
	r    io.ReadCloser
	n    int64
	size int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }
