// Package e2b serves E2B's API on top of sandboxd, so that programs written
// for E2B's SDKs run against a sandboxd server unchanged: they set
// E2B_API_URL and E2B_SANDBOX_URL to its address and E2B_API_KEY to one of
// its keys.
//
// Two surfaces, both on sandboxd's listener:
//   - the control plane (create, list, get, kill, timeout, pause, resume,
//     connect; v1 and v2 paths), authenticated with sandboxd's API keys in
//     X-API-Key and acting through the sandbox manager, so every sandbox
//     keeps sandboxd's quotas, persistence, network policy and keys;
//   - the sandbox's agent (envd's Connect services process.Process and
//     filesystem.Filesystem, /files and /health), routed by the
//     E2b-Sandbox-Id header and authenticated by the sandbox's envd access
//     token in X-Access-Token (or a file link signed with it), forwarded
//     as it is to the sandbox's guest agent, which speaks envd's protocol.
//
// What sandboxd knows of a sandbox beyond its own row (template, metadata,
// access token) is kept in the store's e2b_sandboxes table.
package e2b

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/api"
	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// EnvdVersion is the envd version sandboxd's guest agent answers for: the
// SDKs turn features on by it (stdin of commands from 0.3.0, the
// template's default user from 0.4.0, closing stdin from 0.5.2, octet-stream
// uploads from 0.5.7), so it names the newest whose features the agent
// really has.
const EnvdVersion = "0.5.7"

// DefaultTemplate is the template E2B's SDKs ask for when given none.
const DefaultTemplate = "base"

// Sandboxes is what the API does to sandboxes (package sandbox's Manager).
type Sandboxes interface {
	Create(ctx context.Context, accountID string, req sandbox.CreateRequest) (sb store.Sandbox, runID string, err error)
	Live(ctx context.Context, sbs []store.Sandbox) []store.Sandbox
	Stop(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	SetTimeout(ctx context.Context, p auth.Principal, id string, d time.Duration) (store.Sandbox, error)
	Pause(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	Resume(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	AgentTransport(ctx context.Context, p auth.Principal, id string) (http.RoundTripper, error)
	Stats(ctx context.Context, p auth.Principal, id string) (runtime.Stats, error)
	Fork(ctx context.Context, p auth.Principal, id string, count int, lifetime time.Duration) ([]store.Sandbox, error)
	SetNetwork(ctx context.Context, p auth.Principal, id string, policy netpol.Policy) (store.Sandbox, error)
}

// Store is what the API reads and records.
type Store interface {
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	ListSandboxesByID(ctx context.Context, ids []string) ([]store.Sandbox, error)
	CreateE2BSandbox(ctx context.Context, e store.E2BSandbox) error
	GetE2BSandbox(ctx context.Context, id string) (store.E2BSandbox, error)
	ListLiveE2BSandboxes(ctx context.Context, accountID string, after store.Cursor, limit int) ([]store.E2BSandbox, error)
	ListLiveE2BSandboxesOn(ctx context.Context, nodeID string) ([]store.E2BSandbox, error)
}

// Cluster routes requests between the nodes of a cluster: the API's own
// view of it (package cluster's Router), so that E2B's routes are placed
// and forwarded exactly as the API's are.
type Cluster = api.Cluster

// PortProxy forwards a request to a port of a sandbox (netpol.Proxy).
type PortProxy interface {
	ServePort(w http.ResponseWriter, r *http.Request, id string, port int)
}

// Options configure the API.
type Options struct {
	Sandboxes Sandboxes
	Store     Store
	Auth      *auth.Authenticator
	// NodeID is this node's: signed file links are checked against the
	// sandboxes it hosts.
	NodeID string
	// Templates are the template ids a create may name besides
	// DefaultTemplate (the server's image): all start the server's image.
	Templates []string
	// CPUs and MemoryMB are what a sandbox is given, as reported.
	CPUs     int
	MemoryMB int
	DiskMB   int
	// MaxTimeout is the longest lifetime a request may ask for (the
	// manager's), so that a longer one is refused in seconds, E2B's unit.
	MaxTimeout time.Duration
	// DefaultUser is who a request that names no user acts as (default
	// "user": see DefaultUserOf).
	DefaultUser string
	// Domain, when set, is the wildcard domain sandboxes are reached at
	// (E2B's domain): PORT-ID.DOMAIN is port PORT of sandbox ID (see
	// HostRouter), and creates answer it so that the SDKs' getHost(port)
	// names it. The operator points *.DOMAIN at sandboxd.
	Domain string
	// Ports serves a sandbox's ports (the port proxy).
	Ports PortProxy
	// Cluster is nil on a single node.
	Cluster Cluster
	Logger  *slog.Logger
	Now     func() time.Time
}

// API is the E2B-compatible API.
type API struct {
	opts  Options
	log   *slog.Logger
	start http.Handler // process.Process/Start (see startHandler)
	cpu   cpuSamples
}

// New builds the API.
func New(opts Options) (*API, error) {
	if opts.Sandboxes == nil || opts.Store == nil || opts.Auth == nil {
		return nil, errors.New("e2b: a sandbox manager, a store and an authenticator are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.Domain = strings.ToLower(strings.Trim(opts.Domain, "."))
	if opts.DefaultUser == "" {
		opts.DefaultUser = defaultUser
	}
	a := &API{opts: opts, log: opts.Logger}
	a.start = a.startHandler()
	return a, nil
}

// Routes returns the handlers to mount on the server's router, by chi
// pattern.
func (a *API) Routes() map[string]http.Handler {
	cp := ownPattern(a.controlPlane())
	agent := http.HandlerFunc(a.serveAgent)
	return map[string]http.Handler{
		"/sandboxes":               cp,
		"/sandboxes/*":             cp,
		"/v2/sandboxes":            cp,
		"/v2/sandboxes/*":          cp,
		"/templates":               cp,
		"/files":                   agent,
		"/health":                  agent,
		"/process.Process/*":       agent,
		"/filesystem.Filesystem/*": agent,
	}
}

// ownPattern has the control plane's router name a request by its own
// route pattern alone. It routes on the whole path, so the pattern of the
// mount point it is reached through (such as "/v2/sandboxes/*") would
// otherwise be joined to its own in the server's metrics and logs
// ("/v2/sandboxes/v2/sandboxes").
func ownPattern(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rc := chi.RouteContext(r.Context()); rc != nil {
			rc.RoutePatterns = rc.RoutePatterns[:0]
		}
		h.ServeHTTP(w, r)
	})
}

// e2bID is how the E2B API names sandbox id: its "sbx_" as "sbx-", so that
// the id is a DNS label (the PORT-ID.DOMAIN hosts) and a host name.
func e2bID(id string) string {
	if rest, ok := strings.CutPrefix(id, "sbx_"); ok {
		return "sbx-" + rest
	}
	return id
}

// sandboxID is the sandbox an id given to the E2B API names: its own form
// (e2bID) or sandboxd's.
func sandboxID(id string) string {
	if rest, ok := strings.CutPrefix(id, "sbx-"); ok {
		return "sbx_" + rest
	}
	return id
}
