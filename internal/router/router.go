// Package router is the server's one HTTP router: the middleware every
// request passes (a request id, the sandboxd_http_* metrics and request log
// lines, CORS) and the front ends mounted on it as peers: the REST API,
// E2B's API, MCP, the git server, the model proxy and the console. It
// belongs to none of them and knows none of them: each hands it its routes
// (cmd/sandboxd wires them), so that no front end mounts another.
package router

import (
	"log/slog"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxd/sandboxd/internal/edge"
)

// Route is one route of a front end.
type Route struct {
	// Method is the route's method; "" is any method (a mount point).
	Method string
	// Pattern is the route's path, in chi's syntax ("/api/sandboxes/{id}",
	// "/git/*"); it names the route in the metrics and the log.
	Pattern string
	Handler http.Handler
}

// Mounts are the routes of handlers mounted at patterns, for any method.
func Mounts(m map[string]http.Handler) []Route {
	routes := make([]Route, 0, len(m))
	for pattern, h := range m {
		routes = append(routes, Route{Pattern: pattern, Handler: h})
	}
	return routes
}

// Options configure the router.
type Options struct {
	Logger *slog.Logger
	// Registry receives the HTTP metrics (default: a registry of its own).
	Registry prometheus.Registerer
	// Routes are the front ends' routes.
	Routes []Route
	// NotFound answers a path no route has, and MethodNotAllowed a path
	// that has routes for other methods (the REST API's error bodies).
	NotFound, MethodNotAllowed http.Handler
	// Hosts, when set, wraps the router for what is routed by the Host
	// header before any path (E2B's sandbox hosts).
	Hosts func(next http.Handler) http.Handler
}

// Router is the server's HTTP handler.
type Router struct {
	log *slog.Logger
	// paths routes by path alone; handler routes by Host first (Hosts).
	paths, handler http.Handler
}

// New builds the router.
func New(opts Options) *Router {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	r := chi.NewRouter()
	r.Use(withRequestID, withObservability(opts.Logger, newMetrics(opts.Registry)), withCORS)
	for _, rt := range opts.Routes {
		if rt.Method == "" {
			r.Handle(rt.Pattern, rt.Handler)
			continue
		}
		r.Method(rt.Method, rt.Pattern, rt.Handler)
	}
	if opts.NotFound != nil {
		r.NotFound(opts.NotFound.ServeHTTP)
	}
	if opts.MethodNotAllowed != nil {
		r.MethodNotAllowed(opts.MethodNotAllowed.ServeHTTP)
	}
	var h http.Handler = r
	if opts.Hosts != nil {
		h = opts.Hosts(h)
	}
	return &Router{log: opts.Logger, paths: r, handler: h}
}

// ServeHTTP implements http.Handler.
func (rt *Router) ServeHTTP(w http.ResponseWriter, r *http.Request) { rt.handler.ServeHTTP(w, r) }

// Paths is the router without its routing by Host (Options.Hosts), for a
// listener that serves no sandbox hosts (the way home from sandboxes).
func (rt *Router) Paths() http.Handler { return rt.paths }

// ClusterHandler is the router as the cluster listener serves it: only
// requests another node of c signed reach it (edge.ClusterHandler), each
// front end then acting for the key the signature names; refuse writes
// the refusal of any other.
func (rt *Router) ClusterHandler(c edge.Cluster, refuse func(w http.ResponseWriter, r *http.Request, err error)) http.Handler {
	return edge.ClusterHandler(c, rt.handler, rt.log, refuse)
}
