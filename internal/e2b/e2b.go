// Package e2b serves E2B's API on top of sandboxd, so that programs written
// for E2B's SDKs run against a sandboxd server unchanged: they set
// E2B_API_URL and E2B_SANDBOX_URL to its address and E2B_API_KEY to one of
// its keys.
//
// Two planes, both on sandboxd's listener, in two packages:
//   - the control plane, this package (create, list, get, kill, timeout,
//     pause, resume, connect, fork, network, metrics, templates and their
//     builds (the Template API, templatebuild.go), volumes; v1 and v2
//     paths; one file per group of routes), authenticated with sandboxd's
//     API keys (edge.Gate) and acting through the sandbox manager, so
//     every sandbox keeps sandboxd's quotas, persistence, network policy
//     and keys;
//   - the data plane, package envd: the sandbox's agent (envd's Connect
//     services, /files and /health) and its ports, authenticated by the
//     sandbox's own tokens.
//
// API composes the two for the server: Routes and HostRouter.
//
// What sandboxd knows of a sandbox beyond its own row (template, metadata,
// access token) is kept in the store's e2b_sandboxes table.
package e2b

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/e2b/envd"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/sandbox"
	"github.com/sandboxd/sandboxd/internal/store"
)

// EnvdVersion is the envd version the sandboxes' agents answer for
// (envd.Version).
const EnvdVersion = envd.Version

// DefaultTemplate is the template E2B's SDKs ask for when given none.
const DefaultTemplate = "base"

// CodeInterpreterTemplate is the template E2B's code-interpreter SDK asks
// for (its defaultTemplate): a server whose image has the code
// interpreter's kernels starts it.
const CodeInterpreterTemplate = "code-interpreter-v1"

// Sandboxes is what the control plane does to sandboxes (package
// sandbox's Manager: each call by the caller and the sandbox's id, under
// the one access rule), and the envd plane's door to their agents.
type Sandboxes interface {
	envd.Agents
	Create(ctx context.Context, accountID string, req sandbox.CreateRequest) (sb store.Sandbox, runID string, err error)
	Live(ctx context.Context, sbs []store.Sandbox) []store.Sandbox
	Stop(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	SetTimeout(ctx context.Context, p auth.Principal, id string, d time.Duration) (store.Sandbox, error)
	Pause(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	PauseFiles(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	Resume(ctx context.Context, p auth.Principal, id string) (store.Sandbox, error)
	Stats(ctx context.Context, p auth.Principal, id string) (runtime.Stats, error)
	// UsageHistory is a running sandbox's measures taken in [from, to]
	// (sandbox.Manager.UsageHistory).
	UsageHistory(ctx context.Context, p auth.Principal, id string, from, to time.Time) ([]sandbox.UsageSample, error)
	Fork(ctx context.Context, p auth.Principal, id string, count int, lifetime time.Duration) ([]store.Sandbox, error)
	SetNetwork(ctx context.Context, p auth.Principal, id string, policy netpol.Policy) (store.Sandbox, error)
}

// Store is what the API reads and records (both planes).
type Store interface {
	envd.Store
	ListSandboxesByID(ctx context.Context, ids []string) ([]store.Sandbox, error)
	CreateE2BSandbox(ctx context.Context, e store.E2BSandbox) error
	ListLiveE2BSandboxes(ctx context.Context, accountID string, page store.E2BPage) ([]store.E2BSandbox, error)
	// SandboxVolumes and GetVolume say what a sandbox mounts (getInfo's
	// volumeMounts).
	SandboxVolumes(ctx context.Context, id string) ([]store.VolumeAttachment, error)
	GetVolume(ctx context.Context, id string) (store.Volume, error)
}

// Options configure the API.
type Options struct {
	Sandboxes Sandboxes
	Store     Store
	// Gate authenticates the callers (cluster-forwarded ones too), holds
	// the one access rule and forwards the work of a sandbox another node
	// hosts: the server's one gate, shared with the other front ends.
	Gate *edge.Gate
	// NodeID is this node's: signed file links are checked against the
	// sandboxes it hosts.
	NodeID string
	// Templates are the template ids a create may name besides
	// DefaultTemplate (the server's image): all start the server's image.
	Templates []string
	// Custom lists the custom templates (docs/TEMPLATES.md) a create may
	// name, before the built-in ids, and GET /templates lists beside
	// them; nil: none.
	Custom CustomTemplates
	// Files are the accounts' uploaded build files (the Template API's
	// COPY uploads, templatefiles.go); nil: none.
	Files TemplateFiles
	// Events lists lifecycle events and keeps webhooks (events.go); nil:
	// the /events routes answer 404.
	Events Events
	// Volumes are the accounts' volumes (volumes.go: E2B's /volumes and
	// create's volumeMounts); nil: none, GET /volumes is empty and the
	// other volume routes answer 404.
	Volumes Volumes
	// CPUs and MemoryMB are what a sandbox is given, as reported.
	CPUs     int
	MemoryMB int
	DiskMB   int
	// MaxTimeout is the longest lifetime a request may ask for (the
	// manager's), so that a longer one is refused in seconds, E2B's unit.
	MaxTimeout time.Duration
	// DefaultUser is who an envd request that names no user acts as
	// (default "user": see DefaultUserOf).
	DefaultUser string
	// Domain, when set, is the wildcard domain sandboxes are reached at
	// (E2B's domain): PORT-ID.DOMAIN is port PORT of sandbox ID (see
	// HostRouter), and creates answer it so that the SDKs' getHost(port)
	// names it. The operator points *.DOMAIN at sandboxd.
	Domain string
	// Ports serves a sandbox's ports (the port proxy).
	Ports  envd.PortProxy
	Logger *slog.Logger
	Now    func() time.Time
}

// API is the E2B-compatible API: the control plane, and the envd plane
// beside it.
type API struct {
	opts Options
	log  *slog.Logger
	gate *edge.Gate
	envd *envd.Proxy
	cpu  cpuSamples
}

// New builds the API.
func New(opts Options) (*API, error) {
	if opts.Sandboxes == nil || opts.Store == nil || opts.Gate == nil {
		return nil, errors.New("e2b: a sandbox manager, a store and a gate are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	gate := opts.Gate
	data, err := envd.New(envd.Options{
		Agents: opts.Sandboxes, Store: opts.Store, Gate: gate,
		NodeID: opts.NodeID, DefaultUser: opts.DefaultUser, Domain: opts.Domain, Ports: opts.Ports,
		Logger: opts.Logger, Now: opts.Now,
	})
	if err != nil {
		return nil, err
	}
	opts.Domain = data.Domain()
	return &API{opts: opts, log: opts.Logger, gate: gate, envd: data}, nil
}

// DefaultUserOf is the user an envd request that names none acts as in
// sandboxes started from the root filesystem rootfs (envd.DefaultUserOf).
func DefaultUserOf(rootfs string) string { return envd.DefaultUserOf(rootfs) }

// Routes returns the handlers to mount on the server's router, by chi
// pattern: the control plane's and envd's.
func (a *API) Routes() map[string]http.Handler {
	cp := ownPattern(a.controlPlane())
	routes := map[string]http.Handler{
		"/sandboxes":       cp,
		"/sandboxes/*":     cp,
		"/v2/sandboxes":    cp,
		"/v2/sandboxes/*":  cp,
		"/templates":       cp,
		"/templates/*":     cp,
		"/v3/templates":    cp,
		"/v2/templates/*":  cp,
		"/snapshots":       cp,
		"/events/*":        cp,
		"/volumes":         cp,
		"/volumes/*":       cp,
		"/volumecontent/*": cp,
	}
	maps.Copy(routes, a.envd.Routes())
	return routes
}

// HostRouter serves requests for the PORT-ID.DOMAIN hosts of sandboxes'
// ports and agents (envd.Proxy.HostRouter) and passes any other to next.
func (a *API) HostRouter(next http.Handler) http.Handler { return a.envd.HostRouter(next) }

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
