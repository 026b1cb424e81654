// Package api serves the HTTP contract (docs/API.md): routes, request
// validation with the contract's exact messages, error bodies, CORS, and the
// OpenAPI document generated from the same route table. It authenticates
// every request through internal/auth and delegates the work to service
// interfaces; it never touches a runtime or a repository itself.
package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Store is what the API reads directly from the database.
type Store interface {
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	ListSandboxesPage(ctx context.Context, accountID string, after store.Cursor, limit int) ([]store.Sandbox, error)
	ListActiveSandboxes(ctx context.Context, accountID string) ([]store.Sandbox, error)
	LatestRunIDs(ctx context.Context, sandboxIDs []string) (map[string]string, error)
	GetRun(ctx context.Context, id string) (store.Run, error)
	ListRunsPage(ctx context.Context, accountID string, after store.Cursor, limit int) ([]store.Run, error)
	GetEnvironment(ctx context.Context, accountID string) (store.Environment, error)
	GetSnapshot(ctx context.Context, id string) (store.Snapshot, error)
	ListSnapshots(ctx context.Context, accountID string) ([]store.Snapshot, error)
}

// Options configure the API server.
type Options struct {
	Store  Store
	Auth   *auth.Authenticator
	Logger *slog.Logger
	// Registry receives the HTTP metrics. The API does not serve it: they
	// name every route with its counts, so `sandboxd serve` exposes them on
	// a listener of their own (--metrics-addr, loopback by default).
	Registry *prometheus.Registry
	Version  string
	// Runtime describes the sandbox backend in one line (GET /api/health).
	Runtime string
	// Degraded says what the server's setup lacks, one line each, public
	// (GET /api/health); nil when nothing.
	Degraded []string
	// Services; a nil service makes its routes answer 501 after validating
	// and authenticating the request.
	Sandboxes SandboxService
	Files     FileService
	Agents    AgentService
	// SandboxFiles moves files into and out of running sandboxes (GET and
	// PUT /api/sandboxes/{id}/files); nil answers 501.
	SandboxFiles SandboxFileService
	// RunLogs opens the logs of the runs this node worked, for GET
	// /api/tasks/runs/{id}/log; nil answers 501.
	RunLogs RunLogService
	// Environments owns the accounts' environment rows (PATCH
	// /api/sandboxes).
	Environments EnvironmentService
	// Proxy forwards /api/sandboxes/{id}/proxy/{port}/... to the sandbox's
	// port once the caller's access to the sandbox is checked; nil answers
	// 501.
	Proxy http.Handler
	// ModelUsage reports the accounts' model proxy usage and budgets (GET
	// /api/model/usage); nil answers 501.
	ModelUsage ModelUsageService
	// Mount adds handlers outside the JSON API (e.g. the git server).
	Mount map[string]http.Handler
	// Cluster routes requests between the nodes of a cluster; nil for a
	// single node.
	Cluster Cluster
	// BodyIdleTimeout is how long a request body may send nothing, and
	// BodyTimeout how long it may take in all, before it is cut off (408);
	// 0 is the default (DefaultBodyIdleTimeout, DefaultBodyTimeout), a
	// negative value none. The port proxy's bodies are the sandbox's
	// application's and have neither.
	BodyIdleTimeout, BodyTimeout time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Cluster is what the API needs of a cluster (package cluster, wired by
// serve): requests for a sandbox another node hosts are served there, and
// creates go where placement puts them.
type Cluster interface {
	// Forwarded authenticates a request that came in on the cluster
	// listener: the id of the caller's key, and whether it is a create
	// this node was chosen for. An unsigned or badly signed request is an
	// error.
	Forwarded(r *http.Request) (keyID string, placed bool, err error)
	// HostOf returns the node a request for sandbox id is served on when
	// that is another node that is up; ok is false to serve it here.
	HostOf(ctx context.Context, sandboxID string) (node string, ok bool)
	// Place chooses the node for a new sandbox with network (nil: the
	// server's default); local when it is this one. It fails with
	// errdefs.ErrQuota, saying why, when no node can take it.
	Place(ctx context.Context, network *netpol.Policy) (node string, local bool, err error)
	// Forward serves r on node for the caller whose key is keyID (placed:
	// a create placed there).
	Forward(w http.ResponseWriter, r *http.Request, node, keyID string, placed bool)
}

// Server is the HTTP API.
type Server struct {
	opts    Options
	log     *slog.Logger
	body    bodyLimits
	handler http.Handler
	openapi []byte
	routes  []route
}

// New builds the API server.
func New(opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{opts: opts, log: opts.Logger, body: bodyLimits{
		idle:  orDefault(opts.BodyIdleTimeout, DefaultBodyIdleTimeout),
		total: orDefault(opts.BodyTimeout, DefaultBodyTimeout),
	}}
	s.routes = s.routeTable()
	doc, err := openAPIDocument(s.routes, opts.Version)
	if err != nil {
		return nil, err
	}
	s.openapi = doc

	r := chi.NewRouter()
	r.Use(withRequestID, withObservability(s.log, newMetrics(opts.Registry)), withCORS)
	for _, rt := range s.routes {
		h := s.serveRoute(rt.handler)
		if !rt.public {
			h = s.authenticated(h, rt)
		}
		if rt.anyMethod {
			// The port proxy: its bodies are the sandbox application's
			// business, deadlines included.
			r.Handle(rt.path, h)
			continue
		}
		// Outside authenticated, so that a body forwarded to another
		// node has its deadlines here, where its client is.
		r.Method(rt.method, rt.path, s.withBodyDeadline(h))
	}
	for pattern, h := range opts.Mount {
		r.Handle(pattern, h)
	}
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.log, errNotFound("Not found"))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.log, &Error{Status: http.StatusMethodNotAllowed, Msg: "Method not allowed"})
	})
	s.handler = r
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// serveRoute adapts a route's handler: the one place its error is written.
func (s *Server) serveRoute(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			writeError(w, r, s.log, err)
		}
	}
}

// OpenAPI returns the generated OpenAPI 3.1 document.
func (s *Server) OpenAPI() []byte { return s.openapi }

// OpenAPIDocument is the document a server of this version serves at GET
// /api/openapi.json, built without one (no services, no store): the route
// table it comes from is the same, so `sandboxd openapi` and the committed
// copy the typed clients are generated from cannot differ from what a
// server answers.
func OpenAPIDocument(version string) ([]byte, error) {
	return openAPIDocument((&Server{}).routeTable(), version)
}

// authenticated resolves the caller's key before the handler runs. In a
// cluster, a request for a sandbox another node hosts is then forwarded
// there; a request that came in on the cluster listener is authenticated
// by its signature and served here.
func (s *Server) authenticated(next http.HandlerFunc, rt route) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, forwarded, err := s.caller(r, rt)
		if err == nil {
			err = checkScope(r, p, rt.acts)
		}
		if err != nil {
			writeError(w, r, s.log, authError(err))
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey, p))
		if c := s.opts.Cluster; c != nil && !forwarded {
			if id := chi.URLParam(r, "id"); id != "" && strings.HasPrefix(rt.path, "/api/sandboxes/{id}") {
				if node, ok := c.HostOf(r.Context(), id); ok {
					c.Forward(w, r, node, p.KeyID, false)
					return
				}
			}
		}
		next(w, r)
	}
}

// caller is the principal of a request: its key's, or, on the cluster
// listener, the key another node named in a signed forward.
func (s *Server) caller(r *http.Request, rt route) (p auth.Principal, forwarded bool, err error) {
	if viaCluster(r) {
		if s.opts.Cluster == nil {
			return p, false, auth.ErrUnauthorized
		}
		keyID, _, err := s.opts.Cluster.Forwarded(r)
		if err != nil {
			s.log.WarnContext(r.Context(), "refused a request on the cluster listener", "err", err, "remote", r.RemoteAddr)
			return p, false, auth.ErrUnauthorized
		}
		p, err = s.opts.Auth.AuthenticateKeyID(r.Context(), keyID)
		return p, true, err
	}
	key, err := requestKey(r, rt.websocket)
	if err != nil {
		return p, false, err
	}
	p, err = s.opts.Auth.Authenticate(r.Context(), key)
	return p, false, err
}

// ClusterHandler is the API as the cluster listener serves it: requests
// there are forwarded by other nodes and authenticated by their signature
// (Options.Cluster), never by a key.
func (s *Server) ClusterHandler() http.Handler {
	return ClusterHandler(s.opts.Cluster, s.handler, s.log)
}

// ClusterHandler is h as the cluster listener serves it. Every request must
// carry another node's valid signature (c.Forwarded), whatever its path:
// the listener is the nodes' channel, and the handlers mounted beside the
// API (the git server, MCP, the console, the model proxy) authenticate plain
// keys, which must not reach them there. A signed request is marked as
// having come in there (ViaCluster), for h and the API's routes to act for
// the key it names. Without a cluster (c nil) every request is refused.
func ClusterHandler(c Cluster, h http.Handler, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := errors.New("not part of a cluster")
		if c != nil {
			_, _, err = c.Forwarded(r)
		}
		if err != nil {
			log.WarnContext(r.Context(), "refused an unsigned request on the cluster listener", "err", err, "remote", r.RemoteAddr, "path", r.URL.Path)
			writeError(w, r, log, &Error{Status: http.StatusUnauthorized, Msg: "The cluster listener serves only requests forwarded by another node of the cluster (signed); call the node's API address instead", Message: true})
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), viaClusterKey, true)))
	})
}

// viaCluster says r came in on the cluster listener.
func viaCluster(r *http.Request) bool { return ViaCluster(r) }

// ViaCluster says r came in on the cluster listener: handlers mounted
// beside the API (Options.Mount) must then authenticate it by its
// signature (Cluster.Forwarded), as the API's own routes do.
func ViaCluster(r *http.Request) bool {
	v, _ := r.Context().Value(viaClusterKey).(bool)
	return v
}

// authError maps auth's errors to the contract's bodies.
func authError(err error) error {
	switch {
	case errors.Is(err, auth.ErrCredentials):
		return &Error{Status: http.StatusUnauthorized, Msg: "Exactly one of x-api-key or Authorization must be provided"}
	case errors.Is(err, auth.ErrUnauthorized):
		return &Error{Status: http.StatusUnauthorized, Msg: "Unauthorized", Message: true}
	case errors.Is(err, auth.ErrInvalidAccountID):
		return errField("account_id must be a valid UUID", "account_id")
	case errors.Is(err, auth.ErrForbidden):
		return &Error{Status: http.StatusForbidden, Msg: "Access denied to specified account_id"}
	}
	return err
}

func principal(r *http.Request) auth.Principal { return principalIn(r.Context()) }

// principalIn is the authenticated caller a request's context carries.
func principalIn(ctx context.Context) auth.Principal {
	p, _ := ctx.Value(principalKey).(auth.Principal)
	return p
}

// actFor resolves the account a request acts for (account_id or the key's
// own) through the one access rule.
func (s *Server) actFor(r *http.Request, requested string) (string, error) {
	id, err := s.opts.Auth.ResolveAccount(r.Context(), principal(r), requested)
	if err != nil {
		return "", authError(err)
	}
	return id, nil
}

// mayAccess reports whether the caller may see something owned by account;
// callers answer 404, never 403, so that ids cannot be probed.
func (s *Server) mayAccess(r *http.Request, account string) (bool, error) {
	return s.opts.Auth.MayActFor(r.Context(), principal(r), account)
}

// isUUID reports whether s is a canonical UUID.
func isUUID(s string) bool { return auth.IsUUID(s) }
