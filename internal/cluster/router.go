package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/store"
)

// Router is a node's side of the cluster for the API (api.Cluster): which
// node serves a request, placement of creates, and the forwarding itself.
type Router struct {
	st     *store.Store
	self   string
	secret Secret
	fw     *Forwarder
	placer Placer
	// defaultNetwork says whether a create that names no network gets
	// one (serve's --network-default).
	defaultNetwork bool
	log            *slog.Logger

	mu    sync.Mutex
	nodes map[string]cachedNode
}

// RouterConfig configures a Router.
type RouterConfig struct {
	Store  *store.Store
	NodeID string
	Secret Secret
	// TLS, when set, is mutual TLS for the forwards (nil: plain HTTP on a
	// private network).
	TLS *TLS
	// Choices is K of best-of-K placement (default 2).
	Choices int
	// DownAfter is how long a node's heartbeat may be silent before it is
	// down: placement skips a node silent for that long even before it
	// is declared down.
	DownAfter      time.Duration
	DefaultNetwork bool
	Logger         *slog.Logger
}

// nodeTTL is how long a node's row is reused for routing: addresses and
// states change rarely, and a request per forward would double the
// database's work.
const nodeTTL = 2 * time.Second

type cachedNode struct {
	node store.Node
	at   time.Time
}

// NewRouter returns the Router of node cfg.NodeID.
func NewRouter(cfg RouterConfig) *Router {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Choices <= 0 {
		cfg.Choices = 2
	}
	return &Router{
		st: cfg.Store, self: cfg.NodeID, secret: cfg.Secret, log: cfg.Logger,
		fw:             NewForwarder(cfg.Secret, cfg.NodeID, cfg.TLS, cfg.Logger),
		placer:         Placer{Choices: cfg.Choices, Stale: cfg.DownAfter},
		defaultNetwork: cfg.DefaultNetwork,
		nodes:          map[string]cachedNode{},
	}
}

// Forwarded implements api.Cluster.
func (r *Router) Forwarded(req *http.Request) (keyID string, placed bool, err error) {
	f, err := r.secret.Verify(req, time.Now())
	return f.KeyID, f.Placed, err
}

// HostOf implements api.Cluster: an active sandbox of another node that
// is up is served there; anything else here (a stopped sandbox's row
// answers the same from any node, and one of a node that is down is
// failed by the node that declares it so).
func (r *Router) HostOf(ctx context.Context, sandboxID string) (string, bool) {
	sb, err := r.st.GetSandbox(ctx, sandboxID)
	if err != nil || sb.NodeID == r.self {
		return "", false
	}
	switch sb.Status {
	case store.SandboxPending, store.SandboxRunning, store.SandboxStopping:
	default:
		return "", false
	}
	n, err := r.node(ctx, sb.NodeID)
	if err != nil || n.Status != store.NodeUp || n.Address == "" {
		return "", false
	}
	return n.ID, true
}

// Forward implements api.Cluster.
func (r *Router) Forward(w http.ResponseWriter, req *http.Request, nodeID, keyID string, placed bool) {
	n, err := r.node(req.Context(), nodeID)
	if err != nil {
		r.fw.unreachable(w, req.WithContext(context.WithValue(req.Context(), ctxTarget, target{node: store.Node{ID: nodeID}})), err)
		return
	}
	r.fw.Forward(w, req, n, keyID, placed)
}

// Do sends req to node nodeID for the caller whose key is keyID (placed: a
// create placed there) and returns its response (Forwarder.Do): the MCP
// server's way to have a sandbox's work done on the node that hosts it
// (mcpserver.Cluster).
func (r *Router) Do(req *http.Request, nodeID, keyID string, placed bool) (*http.Response, error) {
	n, err := r.node(req.Context(), nodeID)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", nodeID, err)
	}
	return r.fw.Do(req, n, keyID, placed)
}

// node returns node id's row, from the cache while it is fresh.
func (r *Router) node(ctx context.Context, id string) (store.Node, error) {
	r.mu.Lock()
	c, ok := r.nodes[id]
	r.mu.Unlock()
	if ok && time.Since(c.at) < nodeTTL {
		return c.node, nil
	}
	n, err := r.st.GetNode(ctx, id)
	if err != nil {
		return n, err
	}
	r.mu.Lock()
	r.nodes[id] = cachedNode{node: n, at: time.Now()}
	r.mu.Unlock()
	return n, nil
}
