package edge

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/netpol"
)

type ctxKey int

const viaClusterKey ctxKey = iota

// ViaCluster says r came in on the cluster listener and carries another
// node's valid signature (ClusterHandler checked it): its caller is the key
// the signature names (Gate.Authenticate).
func ViaCluster(r *http.Request) bool {
	v, _ := r.Context().Value(viaClusterKey).(bool)
	return v
}

// ClusterHandler is h as the cluster listener serves it. Every request must
// carry another node's valid signature (c.Forwarded), whatever its path:
// the listener is the nodes' channel, and handlers that authenticate plain
// keys must not be reached there. A signed request is marked (ViaCluster)
// for h's front ends to act for the key it names. Without a cluster (c nil)
// every request is refused; refuse writes the refusal.
func ClusterHandler(c Cluster, h http.Handler, log *slog.Logger, refuse func(w http.ResponseWriter, r *http.Request, err error)) http.Handler {
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
			refuse(w, r, ErrUnsignedForward)
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), viaClusterKey, true)))
	})
}

// Clustered says the server is a node of a cluster.
func (g *Gate) Clustered() bool { return g.cluster != nil }

// Elsewhere is the other node that hosts sandbox id when c's request for it
// is to be served there: never on a single node, and never for a request
// another node forwarded (no second hop).
func (g *Gate) Elsewhere(ctx context.Context, c Caller, id string) (node string, ok bool) {
	if g.cluster == nil || c.Forwarded || id == "" {
		return "", false
	}
	return g.cluster.HostOf(ctx, id)
}

// ForwardIfElsewhere serves r on the node that hosts sandbox id, when that
// is another node (Elsewhere), and says whether it did.
func (g *Gate) ForwardIfElsewhere(w http.ResponseWriter, r *http.Request, c Caller, id string) bool {
	node, ok := g.Elsewhere(r.Context(), c, id)
	if ok {
		g.cluster.Forward(w, r, node, c.KeyID, false)
	}
	return ok
}

// Place chooses the node for c's new sandbox with network: local on a
// single node and for a create another node placed here, else where the
// cluster's placement puts it (errdefs.ErrQuota when no node can take it).
func (g *Gate) Place(ctx context.Context, c Caller, network *netpol.Policy) (node string, local bool, err error) {
	if g.cluster == nil || c.Forwarded {
		return "", true, nil
	}
	return g.cluster.Place(ctx, network)
}

// Forward serves r on node for c (placed: a create placed there).
func (g *Gate) Forward(w http.ResponseWriter, r *http.Request, c Caller, node string, placed bool) {
	g.cluster.Forward(w, r, node, c.KeyID, placed)
}

// Do sends req (its URL a path of the REST API) to node for c and returns
// the node's response; an error means the node did not answer.
func (g *Gate) Do(req *http.Request, c Caller, node string, placed bool) (*http.Response, error) {
	if g.cluster == nil {
		return nil, errors.New("not part of a cluster")
	}
	return g.cluster.Do(req, node, c.KeyID, placed)
}
