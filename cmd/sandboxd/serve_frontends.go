package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/console"
	"github.com/sandboxd/sandboxd/internal/e2b"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/homegate"
	"github.com/sandboxd/sandboxd/internal/image"
	"github.com/sandboxd/sandboxd/internal/mcpserver"
	"github.com/sandboxd/sandboxd/internal/modelproxy"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/repo"
	"github.com/sandboxd/sandboxd/internal/router"
	"github.com/sandboxd/sandboxd/internal/runs"
	"github.com/sandboxd/sandboxd/internal/store"
)

// frontEndOptions are the flags of the front ends: the E2B API, River's
// UI for operators, and the API's request bodies.
type frontEndOptions struct {
	e2bDomain    string
	adminKeyFile string
	adminKey     []byte // read from adminKeyFile by check
	// bodyIdle and bodyTotal are the API's request body deadlines (0:
	// none).
	bodyIdle, bodyTotal time.Duration
}

func (o *frontEndOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.e2bDomain, "e2b-domain", "", "wildcard domain the E2B API's sandboxes are reached at: PORT-ID.DOMAIN is that port of that sandbox (the SDKs' getHost); point *.DOMAIN at this server (env SANDBOXD_E2B_DOMAIN)")
	f.DurationVar(&o.bodyIdle, "request-body-idle-timeout", api.DefaultBodyIdleTimeout, "how long an API request's body (an upload, a JSON body) may send nothing before it is cut off with 408; 0 never")
	f.DurationVar(&o.bodyTotal, "request-body-timeout", api.DefaultBodyTimeout, "how long an API request's body may take to arrive whole before it is cut off with 408; 0 never")
	f.StringVar(&o.adminKeyFile, "admin-key-file", "", "file holding the operators' key (at least 32 bytes): with it, River's job UI is served at /riverui/ to whoever gives that key as the password of HTTP Basic authentication; without it, not at all (env SANDBOXD_ADMIN_KEY_FILE)")
}

// check refuses negative deadlines and reads the operators' key: a bad
// key file stops serve before any work starts.
func (o *frontEndOptions) check() error {
	if err := firstError(
		atLeast("request-body-idle-timeout", o.bodyIdle, 0, "0 (never) or more"),
		atLeast("request-body-timeout", o.bodyTotal, 0, "0 (never) or more"),
	); err != nil {
		return err
	}
	if o.adminKeyFile == "" {
		return nil
	}
	key, err := loadAdminKey(o.adminKeyFile)
	if err != nil {
		return &flagError{[]string{"admin-key-file"}, err}
	}
	o.adminKey = key
	return nil
}

// frontEnds are the handlers the listeners serve.
type frontEnds struct {
	host    http.Handler // the API listener: every front end, E2B's port hosts too
	home    http.Handler // the way home from sandboxes
	cluster http.Handler // other nodes' forwards
	models  *modelproxy.Proxy
}

// frontEndDeps are what the front ends serve.
type frontEndDeps struct {
	stor *storage
	rt   *sandboxRuntime
	clu  *clusterParts
	dom  *domain
	reg  *prometheus.Registry
}

// setupFrontEnds builds the front ends (REST API, E2B, MCP, git, the model
// proxy, the console, River's UI) and mounts them; the cleanup stops
// River's UI.
func setupFrontEnds(ctx context.Context, o *serveOptions, d frontEndDeps, log *slog.Logger) (*frontEnds, func(), error) {
	st, authn, mgr, clu := d.stor.st, d.dom.authn, d.dom.mgr, d.clu
	models, err := setupModelProxy(o.models, authn, st, d.reg, log)
	if err != nil {
		return nil, nil, err
	}
	gate, err := edge.NewGate(authn, edgeCluster(clu), log)
	if err != nil {
		return nil, nil, err
	}
	mcpSrv, err := mcpserver.New(mcpserver.Options{Store: st, Gate: gate, Sandboxes: mgr, Code: mgr, Files: d.dom.files, Templates: d.dom.tpls, Events: d.dom.hooks,
		Volumes: d.dom.volumes,
		Version: version, Logger: log.With("component", "mcp")})
	if err != nil {
		return nil, nil, err
	}
	portProxy := netpol.NewProxy(netpol.ProxyOptions{Resolve: mgr.GuestAddr, Logger: log.With("component", "proxy")})
	e2bAPI, err := setupE2B(o, d, gate, portProxy, log)
	if err != nil {
		return nil, nil, err
	}
	mounts := map[string]http.Handler{
		repo.GitPathPrefix + "*":    d.dom.repos.GitHTTPHandler(authn),
		modelproxy.PathPrefix + "*": models,
		mcpserver.Path:              mcpSrv,
	}
	consoleMounts, err := console.Mounts()
	if err != nil {
		return nil, nil, err
	}
	maps.Copy(mounts, consoleMounts)
	uiCtx, stopUI := context.WithCancel(context.WithoutCancel(ctx))
	riverUI, err := riverUIMounts(uiCtx, d.dom.jobs, o.frontEnds.adminKey, log.With("component", "riverui"))
	if err != nil {
		stopUI()
		return nil, nil, err
	}
	maps.Copy(mounts, riverUI)
	srv, err := api.New(api.Options{
		Store:        st,
		Auth:         authn,
		Logger:       log,
		Gate:         gate,
		Version:      version,
		Runtime:      describeRuntime(d.rt.rt),
		Degraded:     degradedSummaries(d.rt.degraded),
		Environments: d.dom.persist,
		Templates:    d.dom.tpls,
		Volumes:      d.dom.volumes,
		Events:       d.dom.hooks,
		Sandboxes:    mgr,
		SandboxFiles: mgr,
		Agents:       d.dom.agents,
		RunLogs:      runs.Logs{DataDir: d.stor.dataDir},
		Proxy:        portProxy,
		Files:        d.dom.files,
		ModelUsage:   models,
		// 0 in a flag is none; in Options, the default.
		BodyIdleTimeout: orNone(o.frontEnds.bodyIdle),
		BodyTimeout:     orNone(o.frontEnds.bodyTotal),
	})
	if err != nil {
		stopUI()
		return nil, nil, fmt.Errorf("build API: %w", err)
	}
	fe := mountFrontEnds(srv, e2bAPI, mounts, clu, d.reg, log)
	fe.models = models
	return fe, stopUI, nil
}

// mountFrontEnds mounts the front ends as peers on the server's router,
// which has the API's bodies for unmatched paths and routes E2B's sandbox
// hosts before any path, and serves it on each listener.
func mountFrontEnds(srv *api.Server, e2bAPI *e2b.API, mounts map[string]http.Handler, clu *clusterParts, reg *prometheus.Registry, log *slog.Logger) *frontEnds {
	rtr := router.New(router.Options{Logger: log, Registry: reg,
		Routes:   slices.Concat(srv.Routes(), router.Mounts(e2bAPI.Routes()), router.Mounts(mounts)),
		NotFound: http.HandlerFunc(srv.NotFound), MethodNotAllowed: http.HandlerFunc(srv.MethodNotAllowed),
		Hosts: e2bAPI.HostRouter})
	return &frontEnds{
		host: rtr,
		// The way home serves the API, git, MCP and the model proxy only:
		// no E2B routes and no routing by Host (the E2B domain's port
		// hosts).
		home:    homegate.Only(rtr.Paths(), "/api/", repo.GitPathPrefix, mcpserver.Path, modelproxy.PathPrefix),
		cluster: rtr.ClusterHandler(edgeCluster(clu), srv.Refuse),
	}
}

// setupE2B builds the E2B API: its control plane, and its sandboxes' ports
// through portProxy.
func setupE2B(o *serveOptions, d frontEndDeps, gate *edge.Gate, portProxy *netpol.Proxy, log *slog.Logger) (*e2b.API, error) {
	r := o.runtime
	return e2b.New(e2b.Options{
		Domain: o.frontEnds.e2bDomain, Ports: portProxy,
		Sandboxes: d.dom.mgr, Store: d.stor.st, Gate: gate, NodeID: d.stor.nodeID,
		// Every template name starts the server's image: the one it was
		// built from names it too.
		Templates: e2bTemplates(r.template, d.rt.baseDir),
		Custom:    d.dom.tpls,
		Files:     d.dom.tpls,
		Events:    d.dom.hooks,
		Volumes:   d.dom.volumes,
		CPUs:      int(math.Ceil(r.cpus)), MemoryMB: int(r.memoryMiB), DiskMB: int(r.diskMiB), MaxTimeout: o.sandboxes.maxTimeout,
		DefaultUser: e2b.DefaultUserOf(d.rt.baseDir),
		Logger:      log.With("component", "e2b"),
	})
}

// modelOptions are the flags of the model proxy: the model APIs sandboxes
// reach through it, the credentials it adds, and what an account may use.
type modelOptions struct {
	claudeToken, anthropicKey, anthropicURL string
	modelURL, modelKey, model               string
	maxBody                                 int64
	budgets                                 modelproxy.Budgets
}

func (o *modelOptions) register(f *pflag.FlagSet) {
	f.StringVar(&o.claudeToken, "claude-code-oauth-token", "", "Claude OAuth token the model proxy adds to sandboxes' Anthropic requests when no API key is set; never given to sandboxes (env CLAUDE_CODE_OAUTH_TOKEN)")
	f.StringVar(&o.anthropicKey, "anthropic-api-key", "", "Anthropic API key the model proxy adds to sandboxes' requests (Claude Code); never given to sandboxes (env ANTHROPIC_API_KEY)")
	f.StringVar(&o.anthropicURL, "anthropic-base-url", "https://api.anthropic.com", "the Anthropic API the model proxy forwards to (env SANDBOXD_ANTHROPIC_BASE_URL)")
	f.StringVar(&o.modelURL, "model-base-url", "", "OpenAI-compatible model API that prompts (opencode) use through the model proxy (env SANDBOXD_MODEL_BASE_URL)")
	f.StringVar(&o.modelKey, "model-api-key", "", "its API key, added by the model proxy; never given to sandboxes (env SANDBOXD_MODEL_API_KEY)")
	f.Int64Var(&o.maxBody, "model-proxy-max-body", modelproxy.DefaultMaxBody, "largest request body, in bytes, a sandbox may send to a model API through the proxy (413 beyond)")
	f.Int64Var(&o.budgets.TokensPerDay, "model-daily-tokens-per-account", modelproxy.DefaultTokensPerDay, "tokens (input with cache writes and reads, plus output, as the providers report them) one account's sandboxes may use through the model proxy per UTC day, over all nodes; past it the proxy answers 429 until midnight UTC; 0 unlimited")
	f.Int64Var(&o.budgets.RequestsPerDay, "model-daily-requests-per-account", modelproxy.DefaultRequestsPerDay, "requests one account's sandboxes may send through the model proxy per UTC day, over all nodes (429 beyond, until midnight UTC); 0 unlimited")
	f.StringVar(&o.model, "model", "", "the model prompts use (env SANDBOXD_MODEL)")
}

func (o *modelOptions) check() error {
	return firstError(
		checkHTTPURL("anthropic-base-url", o.anthropicURL),
		checkHTTPURL("model-base-url", o.modelURL),
		atLeast("model-proxy-max-body", o.maxBody, 1, "1 or more"),
		atLeast("model-daily-tokens-per-account", o.budgets.TokensPerDay, 0, "0 (unlimited) or more"),
		atLeast("model-daily-requests-per-account", o.budgets.RequestsPerDay, 0, "0 (unlimited) or more"),
	)
}

// checkHTTPURL refuses a flag's value that is neither empty nor an http(s)
// URL with a host.
func checkHTTPURL(flag, v string) error {
	if v == "" {
		return nil
	}
	if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return flagErrorf(flag, "--%s %q: want an http:// or https:// URL", flag, v)
	}
	return nil
}

// anthropicProxy says the model proxy holds an Anthropic credential:
// sandboxes' Claude Code is pointed at it.
func (o *modelOptions) anthropicProxy() bool { return o.anthropicKey != "" || o.claudeToken != "" }

// setupModelProxy builds the model proxy, which adds the operator's
// credentials to sandboxes' model requests.
func setupModelProxy(o modelOptions, authn *auth.Authenticator, st *store.Store, reg *prometheus.Registry, log *slog.Logger) (*modelproxy.Proxy, error) {
	return modelproxy.New(modelproxy.Options{
		Auth: authn,
		Upstreams: map[string]modelproxy.Upstream{
			modelproxy.Anthropic: {BaseURL: o.anthropicURL, APIKey: o.anthropicKey, BearerToken: o.claudeToken},
			modelproxy.OpenAI:    {BaseURL: o.modelURL, APIKey: o.modelKey},
		},
		MaxBody: o.maxBody, Registry: reg, Logger: log.With("component", "modelproxy"),
		// Counted in the database, so every node of a cluster holds an
		// account to one budget.
		Usage: st, Budgets: o.budgets,
	})
}

// e2bTemplates are the E2B template ids that start the server's image: the
// name it was built from, and E2B's code-interpreter template's when it has
// the code interpreter's kernels (the code-interpreter SDK asks for it).
func e2bTemplates(template, rootfs string) []string {
	ids := []string{template}
	if image.HasCodeInterpreter(rootfs) {
		ids = append(ids, e2b.CodeInterpreterTemplate, image.CodeInterpreterTemplate)
	}
	return slices.Compact(slices.Sorted(slices.Values(ids)))
}
