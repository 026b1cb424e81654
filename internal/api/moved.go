package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/sandboxd/sandboxd/internal/edge"
	"github.com/sandboxd/sandboxd/internal/netpol"
)

// What moved to internal/edge, kept under its old names only while
// internal/e2b still imports this package for them (issue 32: the e2b
// front end moves onto the edge itself). Delete this file with that
// import.

// Cluster is edge.Cluster without Do (what e2b takes).
type Cluster interface {
	Forwarded(r *http.Request) (keyID string, placed bool, err error)
	HostOf(ctx context.Context, sandboxID string) (node string, ok bool)
	Place(ctx context.Context, network *netpol.Policy) (node string, local bool, err error)
	Forward(w http.ResponseWriter, r *http.Request, node, keyID string, placed bool)
}

// ViaCluster is edge.ViaCluster.
func ViaCluster(r *http.Request) bool { return edge.ViaCluster(r) }

// ClusterHandler is edge.ClusterHandler refusing with the API's error body.
func ClusterHandler(c Cluster, h http.Handler, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var ec edge.Cluster
	if c != nil {
		ec = withoutDo{c}
	}
	return edge.ClusterHandler(ec, h, log, func(w http.ResponseWriter, r *http.Request, err error) { writeError(w, r, log, err) })
}

// withoutDo is a Cluster as an edge.Cluster whose Do fails (ClusterHandler
// asks only Forwarded).
type withoutDo struct{ Cluster }

func (withoutDo) Do(*http.Request, string, string, bool) (*http.Response, error) {
	return nil, errors.New("not part of a cluster")
}
