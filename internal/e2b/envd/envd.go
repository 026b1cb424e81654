// Package envd is E2B's data plane on sandboxd: the traffic E2B's SDKs send
// to a sandbox rather than to the control plane (package e2b).
//
//   - envd's paths (its Connect services process.Process and
//     filesystem.Filesystem, /files and /health), routed by the
//     E2b-Sandbox-Id header (or the PORT-ID.DOMAIN host of the agent's
//     port), authenticated by the sandbox's envd access token in
//     X-Access-Token or a file link signed with it, and forwarded to the
//     sandbox's guest agent, which speaks envd's protocol;
//   - the sandbox's own ports at PORT-ID.DOMAIN (HostRouter), through the
//     port proxy, behind the sandbox's traffic token when it has one.
//
// It reaches the guest agent only through the sandbox manager's
// AgentTransport, and serves a sandbox another node of a cluster hosts on
// that node (edge.Gate). It authenticates no API key: the control plane,
// which does, imports this package for what both planes say alike (the
// two forms of a sandbox id, Version, the error body), never the reverse.
package envd

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Version is the envd version sandboxd's guest agent answers for: the SDKs
// turn features on by it (stdin of commands from 0.3.0, the template's
// default user from 0.4.0, closing stdin from 0.5.2, octet-stream uploads
// from 0.5.7, files' user metadata from 0.6.2, entries in watch events
// from 0.6.3, watching network mounts from 0.6.4), so it names the newest
// whose features the agent really has.
const Version = "0.6.4"

// E2BID is how E2B's API names sandbox id: its "sbx_" as "sbx-", so that
// the id is a DNS label (the PORT-ID.DOMAIN hosts) and a host name.
func E2BID(id string) string {
	if rest, ok := strings.CutPrefix(id, "sbx_"); ok {
		return "sbx-" + rest
	}
	return id
}

// SandboxID is the sandbox an id given to E2B's API names: its own form
// (E2BID) or sandboxd's.
func SandboxID(id string) string {
	if rest, ok := strings.CutPrefix(id, "sbx-"); ok {
		return "sbx_" + rest
	}
	return id
}

// Error is E2B's error body on both planes, {"code", "message"}: the SDKs
// read code (404 makes kill() return false, 409 makes pause() return
// false).
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	// FailureReason says why a sandbox that failed did (sandboxd's, on
	// the control plane): its routes answer 404, as E2B does for a
	// sandbox that ended, with the reason the REST API's failureReason
	// gives.
	FailureReason string `json:"failureReason,omitempty"`
}

// WriteJSON writes v as the body of a code answer.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes an error as envd does.
func writeError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, Error{Code: code, Message: msg})
}

// Store is what the plane reads: a sandbox's E2B record (its tokens,
// template environment) and its row (is it running).
type Store interface {
	GetSandbox(ctx context.Context, id string) (store.Sandbox, error)
	GetE2BSandbox(ctx context.Context, id string) (store.E2BSandbox, error)
	ListLiveE2BSandboxesOn(ctx context.Context, nodeID string) ([]store.E2BSandbox, error)
}

// Agents is the one door to a sandbox's guest agent (package sandbox's
// Manager, by the caller and the sandbox's id, under the one access rule).
type Agents interface {
	AgentTransport(ctx context.Context, p auth.Principal, id string) (http.RoundTripper, error)
}

// PortProxy forwards a request to a port of a sandbox (netpol.Proxy).
type PortProxy interface {
	ServePort(w http.ResponseWriter, r *http.Request, id string, port int, closed func(http.ResponseWriter))
}

// Options configure the plane.
type Options struct {
	Agents Agents
	Store  Store
	// Gate serves a request for a sandbox another node hosts there.
	Gate *edge.Gate
	// NodeID is this node's: signed file links are checked against the
	// sandboxes it hosts.
	NodeID string
	// DefaultUser is who a request that names no user acts as (default
	// "user": see DefaultUserOf).
	DefaultUser string
	// Domain, when set, is the wildcard domain sandboxes are reached at
	// (E2B's domain): PORT-ID.DOMAIN is port PORT of sandbox ID (see
	// HostRouter). The operator points *.DOMAIN at sandboxd.
	Domain string
	// Ports serves a sandbox's ports (the port proxy).
	Ports  PortProxy
	Logger *slog.Logger
	Now    func() time.Time
}

// Proxy is the plane: it forwards envd's traffic to sandboxes' agents and
// port traffic to their ports.
type Proxy struct {
	opts  Options
	log   *slog.Logger
	start http.Handler // process.Process/Start (see startHandler)
}

// New builds the plane.
func New(opts Options) (*Proxy, error) {
	if opts.Agents == nil || opts.Store == nil || opts.Gate == nil {
		return nil, errors.New("envd: the sandboxes' agents, a store and a gate are required")
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
	p := &Proxy{opts: opts, log: opts.Logger}
	p.start = p.startHandler()
	return p, nil
}

// Domain is the wildcard domain sandboxes are reached at ("" for none).
func (p *Proxy) Domain() string { return p.opts.Domain }

// Routes returns envd's handlers to mount on the server's router, by chi
// pattern.
func (p *Proxy) Routes() map[string]http.Handler {
	agent := http.HandlerFunc(p.serveAgent)
	return map[string]http.Handler{
		"/files":                   agent,
		"/health":                  agent,
		"/process.Process/*":       agent,
		"/filesystem.Filesystem/*": agent,
		// E2B's code-interpreter server's, with E2b-Sandbox-Port 49999
		// (serveCode; /health is both).
		"/execute":    agent,
		"/contexts":   agent,
		"/contexts/*": agent,
	}
}
