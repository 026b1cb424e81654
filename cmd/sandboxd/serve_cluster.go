package main

import (
	"context"
	"log/slog"
)

// setupCluster checks this node against the database (a cluster's nodes
// share PostgreSQL; a node outside one is alone on its database) and, in
// cluster mode, builds the router and listens for the other nodes
// (clusterOptions.open). Its flags are clusterOptions (cluster.go).
func setupCluster(ctx context.Context, c *clusterOptions, stor *storage, rt *sandboxRuntime, nw *network, maxSandboxes int, log *slog.Logger) (*clusterParts, error) {
	if err := c.checkDatabase(ctx, stor.st, stor.nodeID); err != nil {
		return nil, err
	}
	capacity := nodeCapacity(rt.rt, stor.dataDir, maxSandboxes, nw.mgr != nil)
	return c.open(stor.st, stor.nodeID, capacity, nw.on(), log)
}
