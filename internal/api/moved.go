package api

import (
	"net/http"

	"github.com/sandboxd/sandboxd/internal/edge"
)

// What moved to internal/edge, kept under its old names only while
// internal/e2b still imports this package for them (issue 32: the e2b
// front end moves onto the edge itself). Delete this file with that
// import.

// Cluster is edge.Cluster.
type Cluster = edge.Cluster

// ViaCluster is edge.ViaCluster.
func ViaCluster(r *http.Request) bool { return edge.ViaCluster(r) }
