// Package api serves the REST contract (docs/API.md, its types and
// validation in internal/contract): its routes, their error bodies, and the
// OpenAPI document generated from the same route table. It asks the edge
// (internal/edge) who calls, whether the caller may see a sandbox, where a
// request is served and what a failure is told, and delegates the work to
// service interfaces; it never touches a runtime or a repository itself.
// The server's router (internal/router) mounts its routes beside the other
// front ends'.
package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/contract"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/router"
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
	Store   Store
	Auth    *auth.Authenticator
	Logger  *slog.Logger
	Version string
	// Runtime describes the sandbox backend in one line (GET /api/health).
	Runtime string
	// Degraded says what the server's setup lacks, one line each, public
	// (GET /api/health); nil when nothing.
	Degraded []string
	// Services; a nil service makes its routes answer 501 after validating
	// and authenticating the request.
	Sandboxes SandboxService
	Files     contract.FileService
	Agents    AgentService
	// SandboxFiles moves files into and out of running sandboxes (GET and
	// PUT /api/sandboxes/{id}/files); nil answers 501.
	SandboxFiles SandboxFileService
	// RunLogs opens the logs of the runs this node worked, for GET
	// /api/tasks/runs/{id}/log; nil answers 501.
	RunLogs RunLogService
	// Templates builds and keeps the accounts' templates (/api/templates);
	// nil answers 501.
	Templates TemplateService
	// Volumes keeps the accounts' volumes (/api/volumes); nil answers
	// 501.
	Volumes VolumeService
	// Events lists the accounts' lifecycle events and keeps their
	// webhooks (/api/events, /api/webhooks); nil answers 501.
	Events EventService
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
	// Gate authenticates callers, checks their access to a sandbox and
	// forwards requests for a sandbox another node hosts (internal/edge);
	// nil is a single node's gate over Auth.
	Gate *edge.Gate
	// BodyIdleTimeout is how long a request body may send nothing, and
	// BodyTimeout how long it may take in all, before it is cut off (408);
	// 0 is the default (DefaultBodyIdleTimeout, DefaultBodyTimeout), a
	// negative value none. The port proxy's bodies are the sandbox's
	// application's and have neither.
	BodyIdleTimeout, BodyTimeout time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
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
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Gate == nil {
		// A single node's: no cluster to forward to.
		g, err := edge.NewGate(opts.Auth, nil, opts.Logger)
		if err != nil {
			return nil, fmt.Errorf("api: %w", err)
		}
		opts.Gate = g
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

	s.handler = router.New(router.Options{Logger: s.log, Routes: s.Routes(),
		NotFound: http.HandlerFunc(s.NotFound), MethodNotAllowed: http.HandlerFunc(s.MethodNotAllowed)})
	return s, nil
}

// Routes are the API's routes, for the server's router to mount.
func (s *Server) Routes() []router.Route {
	routes := make([]router.Route, 0, len(s.routes))
	for _, rt := range s.routes {
		h := s.serveRoute(rt.handler)
		if !rt.public {
			h = s.authenticated(h, rt)
		}
		if rt.anyMethod {
			// The port proxy: its bodies are the sandbox application's
			// business, deadlines included.
			routes = append(routes, router.Route{Pattern: rt.path, Handler: h})
			continue
		}
		// Outside authenticated, so that a body forwarded to another
		// node has its deadlines here, where its client is.
		routes = append(routes, router.Route{Method: rt.method, Pattern: rt.path, Handler: s.withBodyDeadline(h)})
	}
	return routes
}

// NotFound answers a path no route of the server has, with the API's 404.
func (s *Server) NotFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, r, s.log, contract.NotFound("Not found"))
}

// MethodNotAllowed answers a path whose routes take other methods, with
// the API's 405.
func (s *Server) MethodNotAllowed(w http.ResponseWriter, r *http.Request) {
	writeError(w, r, s.log, &edge.Error{Status: http.StatusMethodNotAllowed, Msg: "Method not allowed"})
}

// ServeHTTP implements http.Handler: the API alone, on a router of its
// own (tests, tools); the server mounts Routes on its router instead.
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
// by its signature and served here (edge.Gate).
func (s *Server) authenticated(next http.HandlerFunc, rt route) http.HandlerFunc {
	keyOf := edge.HeaderKey
	if rt.websocket {
		keyOf = websocketKey
	}
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := s.opts.Gate.Authenticate(r, keyOf)
		if err == nil {
			err = checkScope(r, c.Principal, rt.acts)
		}
		if err != nil {
			writeError(w, r, s.log, err)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), callerKey, c))
		if strings.HasPrefix(rt.path, "/api/sandboxes/{id}") && s.opts.Gate.ForwardIfElsewhere(w, r, c, chi.URLParam(r, "id")) {
			return
		}
		next(w, r)
	}
}

// Refuse answers err with the contract's error body (edge.Explain), for
// handlers outside the API's routes that answer as it does.
func (s *Server) Refuse(w http.ResponseWriter, r *http.Request, err error) {
	writeError(w, r, s.log, err)
}

// caller is the authenticated caller of a request (authenticated).
func caller(r *http.Request) edge.Caller { return callerIn(r.Context()) }

// callerIn is the authenticated caller a request's context carries.
func callerIn(ctx context.Context) edge.Caller {
	c, _ := ctx.Value(callerKey).(edge.Caller)
	return c
}

func principal(r *http.Request) auth.Principal { return caller(r).Principal }

// principalIn is the authenticated principal a request's context carries.
func principalIn(ctx context.Context) auth.Principal { return callerIn(ctx).Principal }

// actFor resolves the account a request acts for (account_id or the key's
// own) through the one access rule.
func (s *Server) actFor(r *http.Request, requested string) (string, error) {
	return s.opts.Gate.Account(r.Context(), caller(r), requested)
}

// sandboxFor loads the sandbox named in the path if the caller may see it
// (edge.Gate.Sandbox); anything else is 404.
func (s *Server) sandboxFor(r *http.Request, requested string) (store.Sandbox, error) {
	return s.opts.Gate.Sandbox(r.Context(), caller(r), chi.URLParam(r, "id"), requested)
}
