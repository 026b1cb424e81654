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
//   - Request bodies are bounded; the caller's credential headers, cookies
//     and hop-by-hop headers never reach the provider.
//   - Every request is metered per account: requests, bytes in and out, and
//     tokens when the provider reports usage in a JSON answer.
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
	name string
	base *url.URL
	rp   *httputil.ReverseProxy
}

type meters struct {
	requests  *prometheus.CounterVec
	bytesIn   *prometheus.CounterVec
	bytesOut  *prometheus.CounterVec
	tokens    *prometheus.CounterVec
	forbidden *prometheus.CounterVec
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
			Help: "Tokens the model providers reported using (JSON answers), by account, provider and kind (input, output).",
		}, []string{"account", "provider", "kind"}),
		forbidden: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandboxd_model_refused_total",
			Help: "Model proxy requests refused before reaching a provider, by reason.",
		}, []string{"reason"}),
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{p.m.requests, p.m.bytesIn, p.m.bytesOut, p.m.tokens, p.m.forbidden} {
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
		up := &upstream{Upstream: u, name: name, base: base}
		up.rp = &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { up.rewrite(pr) },
			Transport: opts.Transport,
			// Stream: every chunk of an SSE answer is passed on at once.
			FlushInterval:  -1,
			ModifyResponse: p.modifyResponse,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				var tooBig *http.MaxBytesError
				if errors.As(err, &tooBig) {
					writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than the model proxy's limit of %d bytes", opts.MaxBody))
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

// ctxKey carries the metering labels from ServeHTTP to modifyResponse.
type ctxKey struct{}

type reqInfo struct {
	account, provider string
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, PathPrefix)
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
	if !cleanPath(path) {
		p.m.forbidden.WithLabelValues("bad_path").Inc()
		writeError(w, http.StatusBadRequest, "invalid path")
		return
	}
	key, err := sandboxKey(r.Header)
	if err != nil {
		p.m.forbidden.WithLabelValues("credentials").Inc()
		writeError(w, http.StatusUnauthorized, err.Error())
		return
	}
	pr, err := p.opts.Auth.Authenticate(r.Context(), key)
	if err != nil {
		p.m.forbidden.WithLabelValues("unauthorized").Inc()
		if !errors.Is(err, auth.ErrUnauthorized) {
			p.log.Error("model proxy: authenticate", "err", err)
			writeError(w, http.StatusInternalServerError, "Internal server error")
			return
		}
		writeError(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	if pr.Scope() != auth.ScopeSandbox {
		p.m.forbidden.WithLabelValues("not_sandbox_key").Inc()
		writeError(w, http.StatusForbidden, "the model proxy serves sandboxes: authenticate with the sandbox's key (RECOUP_API_KEY)")
		return
	}
	if r.ContentLength > p.opts.MaxBody {
		p.m.forbidden.WithLabelValues("too_large").Inc()
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than the model proxy's limit of %d bytes", p.opts.MaxBody))
		return
	}
	info := reqInfo{account: pr.AccountID, provider: name}
	body := &countingReader{r: http.MaxBytesReader(w, r.Body, p.opts.MaxBody)}
	out := r.Clone(context.WithValue(r.Context(), ctxKey{}, info))
	out.Body = body
	out.URL.Path = "/" + path
	out.URL.RawPath = ""
	rec := &httprec.Recorder{ResponseWriter: w}
	start := time.Now()
	up.rp.ServeHTTP(rec, out)
	status := rec.Status
	if status == 0 {
		status = http.StatusOK
	}
	p.m.requests.WithLabelValues(info.account, name, strconv.Itoa(status)).Inc()
	p.m.bytesIn.WithLabelValues(info.account, name).Add(float64(body.n))
	p.m.bytesOut.WithLabelValues(info.account, name).Add(float64(rec.Bytes))
	p.log.Info("model request", "account_id", info.account, "sandbox_id", pr.SandboxID, "provider", name,
		"status", status, "bytes_in", body.n, "bytes_out", rec.Bytes, "elapsed", time.Since(start))
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
	for _, k := range []string{"X-Api-Key", "Authorization", "Cookie", "Proxy-Authorization", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id"} {
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

// maxUsageScan bounds how much of a JSON answer is kept to read its usage.
const maxUsageScan = 1 << 20

// modifyResponse drops credentials the provider might set and meters the
// tokens of JSON answers. Streams are passed on untouched.
func (p *Proxy) modifyResponse(resp *http.Response) error {
	resp.Header.Del("Set-Cookie")
	info, _ := resp.Request.Context().Value(ctxKey{}).(reqInfo)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || resp.Body == nil {
		return nil
	}
	resp.Body = &usageReader{rc: resp.Body, done: func(b []byte) { p.meterUsage(info, b) }}
	return nil
}

// meterUsage reads the usage a provider reported: Anthropic's
// input_tokens/output_tokens or OpenAI's prompt_tokens/completion_tokens.
func (p *Proxy) meterUsage(info reqInfo, body []byte) {
	var v struct {
		Usage struct {
			InputTokens      int64 `json:"input_tokens"`
			OutputTokens     int64 `json:"output_tokens"`
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	if json.Unmarshal(body, &v) != nil {
		return
	}
	in, out := v.Usage.InputTokens+v.Usage.PromptTokens, v.Usage.OutputTokens+v.Usage.CompletionTokens
	if in > 0 {
		p.m.tokens.WithLabelValues(info.account, info.provider, "input").Add(float64(in))
	}
	if out > 0 {
		p.m.tokens.WithLabelValues(info.account, info.provider, "output").Add(float64(out))
	}
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

// cleanPath refuses paths that could climb out of the provider's base
// path once joined to it.
func cleanPath(p string) bool {
	if strings.Contains(p, "\\") || strings.Contains(p, "%") {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." || seg == "." {
			return false
		}
	}
	return true
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"status": "error", "error": msg})
}

type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// usageReader keeps the first maxUsageScan bytes of an answer and hands
// them to done at the end.
type usageReader struct {
	rc   io.ReadCloser
	buf  bytes.Buffer
	done func([]byte)
	ran  bool
}

func (u *usageReader) Read(b []byte) (int, error) {
	n, err := u.rc.Read(b)
	if room := maxUsageScan - u.buf.Len(); room > 0 {
		u.buf.Write(b[:min(n, room)])
	}
	if err == io.EOF && !u.ran {
		u.ran = true
		u.done(u.buf.Bytes())
	}
	return n, err
}

func (u *usageReader) Close() error { return u.rc.Close() }
