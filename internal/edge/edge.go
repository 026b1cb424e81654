// Package edge is what every front end (the REST API, E2B's API, MCP, the
// console's calls) asks before it touches the domain, decided once:
//
//   - who is calling (Gate.Authenticate): a key in X-API-Key or
//     Authorization, or, on the cluster listener, the key another node
//     named in a signed forward;
//   - where the work is done (Gate.Elsewhere, Gate.Place): the node that
//     hosts a sandbox, or the node placement chooses for a new one, never
//     a second hop for a request another node forwarded;
//   - whether the caller may see a sandbox (Gate.Sandbox): the service's
//     one access rule, auth.MayActFor, with what the caller may not see
//     answered as not found so that ids cannot be probed;
//   - what the caller is told of a failure (Explain): one table from error
//     classes to statuses and messages, which never shows an error's cause.
//
// Each front end then only translates: its wire format to a call, and the
// answer (or Explain's verdict) back to its wire format. The front ends are
// peers over this package; none imports another (nomad's Authenticate,
// forward, ResolveACL at the top of every RPC; containerd's services under
// its gRPC and CRI front ends).
package edge

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/auth"
	"github.com/sandboxd/sandboxd/internal/netpol"
	"github.com/sandboxd/sandboxd/internal/store"
)

// Caller is an authenticated request's principal and how it came in.
type Caller struct {
	auth.Principal
	// Forwarded is set for a request another node of the cluster forwarded
	// (its signature checked): it is served here, never forwarded again.
	Forwarded bool
	// Placed is set for a forwarded create that placement chose this node
	// for.
	Placed bool
}

// Cluster is what the edge needs of a cluster (package cluster's Router):
// requests for a sandbox another node hosts are served there, and creates
// go where placement puts them.
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
	// Do sends req, a request to the API (its URL a path), to node's
	// cluster listener for the caller whose key is keyID and returns the
	// node's response, whose body the caller closes. An error means the
	// node did not answer.
	Do(req *http.Request, node, keyID string, placed bool) (*http.Response, error)
}

// Authenticator is the part of auth.Authenticator the gate uses.
type Authenticator interface {
	Authenticate(ctx context.Context, plaintext string) (auth.Principal, error)
	AuthenticateKeyID(ctx context.Context, keyID string) (auth.Principal, error)
	ResolveAccount(ctx context.Context, p auth.Principal, requested string) (string, error)
	SandboxFor(ctx context.Context, p auth.Principal, id, account string) (store.Sandbox, error)
	RunFor(ctx context.Context, p auth.Principal, id, account string) (store.Run, error)
}

// Gate answers the edge's questions for every front end of one server.
type Gate struct {
	auth    Authenticator
	cluster Cluster
	log     *slog.Logger
}

// NewGate returns the gate of a server; cluster is nil on a single node.
func NewGate(a Authenticator, cluster Cluster, log *slog.Logger) (*Gate, error) {
	if a == nil {
		return nil, errors.New("edge: an authenticator is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Gate{auth: a, cluster: cluster, log: log}, nil
}

// KeySource takes the caller's key from a request.
type KeySource func(r *http.Request) (string, error)

// HeaderKey is the key in X-API-Key or Authorization: Bearer, never both
// (auth.KeyFromHeaders).
func HeaderKey(r *http.Request) (string, error) { return auth.KeyFromHeaders(r.Header) }

// Authenticate returns the caller of r. A request that came in on the
// cluster listener (ViaCluster) is the key another node named in its
// signed forward; any other is the key keyOf finds (nil: HeaderKey). The
// errors are auth's (ErrCredentials, ErrUnauthorized), for Explain.
func (g *Gate) Authenticate(r *http.Request, keyOf KeySource) (Caller, error) {
	if ViaCluster(r) {
		if g.cluster == nil {
			return Caller{}, auth.ErrUnauthorized
		}
		keyID, placed, err := g.cluster.Forwarded(r)
		if err != nil {
			g.log.WarnContext(r.Context(), "refused a request on the cluster listener", "err", err, "remote", r.RemoteAddr)
			return Caller{}, auth.ErrUnauthorized
		}
		p, err := g.auth.AuthenticateKeyID(r.Context(), keyID)
		return Caller{Principal: p, Forwarded: true, Placed: placed}, err
	}
	if keyOf == nil {
		keyOf = HeaderKey
	}
	key, err := keyOf(r)
	if err != nil {
		return Caller{}, err
	}
	p, err := g.auth.Authenticate(r.Context(), key)
	return Caller{Principal: p}, err
}

// Account is the account a call acts for: requested (an account_id) when
// the caller may act for it, else, when requested is empty, the caller's
// own. The errors are auth's (ErrInvalidAccountID, ErrForbidden).
func (g *Gate) Account(ctx context.Context, c Caller, requested string) (string, error) {
	return g.auth.ResolveAccount(ctx, c.Principal, requested)
}

// Sandbox loads sandbox id for c under the one access rule
// (auth.Authenticator.SandboxFor): with account (an account_id) only that
// account's, else any account's c may act for. What c may not see is
// errdefs.ErrNotFound, as a sandbox that does not exist.
func (g *Gate) Sandbox(ctx context.Context, c Caller, id, account string) (store.Sandbox, error) {
	return g.auth.SandboxFor(ctx, c.Principal, id, account)
}

// Run loads task run id for c under the same rule as Sandbox; what c may
// not see is errdefs.ErrNotFound, as a run that does not exist.
func (g *Gate) Run(ctx context.Context, c Caller, id, account string) (store.Run, error) {
	return g.auth.RunFor(ctx, c.Principal, id, account)
}
