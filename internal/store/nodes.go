package store

import (
	"context"
	"fmt"
	"time"
)

const nodeCols = "id, hostname, started_at, heartbeat_at"

func scanNode(s scanner) (Node, error) {
	var n Node
	var started, heartbeat int64
	if err := s.Scan(&n.ID, &n.Hostname, &started, &heartbeat); err != nil {
		return Node{}, err
	}
	n.StartedAt = fromMillis(started)
	n.HeartbeatAt = fromMillis(heartbeat)
	return n, nil
}

// UpsertNode records node n, replacing the row of a node with the same ID
// (a node that restarted). A zero StartedAt is now; a zero HeartbeatAt is
// StartedAt. The ID must not be empty.
func (q *Queries) UpsertNode(ctx context.Context, n *Node) error {
	if n == nil || n.ID == "" {
		return fmt.Errorf("upsert node: %w: node without id", ErrInvalid)
	}
	if n.StartedAt.IsZero() {
		n.StartedAt = nowMS()
	}
	n.StartedAt = ms(n.StartedAt)
	if n.HeartbeatAt.IsZero() {
		n.HeartbeatAt = n.StartedAt
	}
	n.HeartbeatAt = ms(n.HeartbeatAt)
	_, err := q.exec(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname,
			started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at`,
		n.ID, n.Hostname, toMillis(n.StartedAt), toMillis(n.HeartbeatAt))
	if err != nil {
		return fmt.Errorf("upsert node %s: %w", n.ID, mapErr(err))
	}
	return nil
}

// HeartbeatNode records that node id was alive at the given time; an unknown
// id is ErrNotFound.
func (q *Queries) HeartbeatNode(ctx context.Context, id string, at time.Time) error {
	n, err := q.execCount(ctx, "UPDATE nodes SET heartbeat_at = ? WHERE id = ?", toMillis(ms(at)), id)
	if err != nil {
		return fmt.Errorf("heartbeat node %s: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("heartbeat node %s: %w", id, ErrNotFound)
	}
	return nil
}

// ListNodes returns every node, by id.
func (q *Queries) ListNodes(ctx context.Context) ([]Node, error) {
	out, err := queryAll(ctx, q, scanNode, "SELECT "+nodeCols+" FROM nodes ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}
