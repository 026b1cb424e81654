package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrNodeDown: the node was declared down by another node (its heartbeats
// stopped for too long); it must give up what it hosted before it is up
// again (SetNodeUp).
var ErrNodeDown = errors.New("node was declared down")

const nodeCols = "id, hostname, started_at, heartbeat_at, address, status, schedule, capacity, version, down_at"

func scanNode(s scanner) (Node, error) {
	var n Node
	var started, heartbeat int64
	var capacity string
	var down sql.NullInt64
	if err := s.Scan(&n.ID, &n.Hostname, &started, &heartbeat, &n.Address, &n.Status, &n.Schedule, &capacity, &n.Version, &down); err != nil {
		return Node{}, err
	}
	n.StartedAt = fromMillis(started)
	n.HeartbeatAt = fromMillis(heartbeat)
	if down.Valid {
		n.DownAt = fromMillis(down.Int64)
	}
	// A capacity that does not parse (never written so) reads as none.
	_ = json.Unmarshal([]byte(capacity), &n.Capacity)
	return n, nil
}

// UpsertNode records node n as up, replacing the row of a node with the
// same ID (a node that restarted) but for the operator's Schedule, which
// a restart keeps. A zero StartedAt is now; a zero HeartbeatAt is
// StartedAt. The ID must not be empty. A node that was declared down must
// be up again through SetNodeUp (after giving up what it hosted), not
// through this: UpsertNode of a down node fails with ErrNodeDown.
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
	capacity, err := json.Marshal(n.Capacity)
	if err != nil {
		return fmt.Errorf("upsert node %s: %w", n.ID, err)
	}
	cur, err := q.GetNode(ctx, n.ID)
	switch {
	case err == nil && cur.Status == NodeDown:
		return fmt.Errorf("upsert node %s: %w", n.ID, ErrNodeDown)
	case err == nil:
		n.Schedule = cur.Schedule
	case !errors.Is(err, ErrNotFound):
		return err
	}
	n.Status, n.DownAt = NodeUp, time.Time{}
	_, err = q.exec(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)
		ON CONFLICT (id) DO UPDATE SET hostname = excluded.hostname,
			started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
			address = excluded.address, capacity = excluded.capacity, version = excluded.version`,
		n.ID, n.Hostname, toMillis(n.StartedAt), toMillis(n.HeartbeatAt), n.Address, NodeUp, n.Schedule, string(capacity), n.Version)
	if err != nil {
		return fmt.Errorf("upsert node %s: %w", n.ID, mapErr(err))
	}
	return nil
}

// GetNode returns the node with the given id.
func (q *Queries) GetNode(ctx context.Context, id string) (Node, error) {
	n, err := scanNode(q.queryRow(ctx, "SELECT "+nodeCols+" FROM nodes WHERE id = ?", id))
	if err != nil {
		return Node{}, fmt.Errorf("get node %s: %w", id, notFound(err))
	}
	return n, nil
}

// HeartbeatNode records that node id was alive at the given time. An
// unknown id is ErrNotFound; a node declared down meanwhile is
// ErrNodeDown, and its heartbeat is not recorded.
func (q *Queries) HeartbeatNode(ctx context.Context, id string, at time.Time) error {
	n, err := q.execCount(ctx, "UPDATE nodes SET heartbeat_at = ? WHERE id = ? AND status = ?", toMillis(ms(at)), id, NodeUp)
	if err != nil {
		return fmt.Errorf("heartbeat node %s: %w", id, err)
	}
	if n == 1 {
		return nil
	}
	if _, err := q.GetNode(ctx, id); err != nil {
		return fmt.Errorf("heartbeat node %s: %w", id, err)
	}
	return fmt.Errorf("heartbeat node %s: %w", id, ErrNodeDown)
}

// MarkNodesDown declares down every up node whose last heartbeat is older
// than cutoff and returns those this call declared: each node is returned
// to exactly one caller however many nodes check at once (a compare-and-set
// per node), which then fails what the node hosted.
func (q *Queries) MarkNodesDown(ctx context.Context, cutoff, now time.Time) ([]Node, error) {
	stale, err := queryAll(ctx, q, scanNode, "SELECT "+nodeCols+" FROM nodes WHERE status = ? AND heartbeat_at < ? ORDER BY id",
		NodeUp, toMillis(ms(cutoff)))
	if err != nil {
		return nil, fmt.Errorf("list stale nodes: %w", err)
	}
	var out []Node
	for _, n := range stale {
		c, err := q.execCount(ctx, "UPDATE nodes SET status = ?, down_at = ? WHERE id = ? AND status = ? AND heartbeat_at = ?",
			NodeDown, toMillis(ms(now)), n.ID, NodeUp, toMillis(n.HeartbeatAt))
		if err != nil {
			return out, fmt.Errorf("mark node %s down: %w", n.ID, err)
		}
		if c == 1 {
			n.Status, n.DownAt = NodeDown, ms(now)
			out = append(out, n)
		}
	}
	return out, nil
}

// SetNodeUp records that node id, declared down, is up again at now (it
// has given up what it hosted).
func (q *Queries) SetNodeUp(ctx context.Context, id string, now time.Time) error {
	n, err := q.execCount(ctx, "UPDATE nodes SET status = ?, down_at = NULL, heartbeat_at = ? WHERE id = ?", NodeUp, toMillis(ms(now)), id)
	if err != nil {
		return fmt.Errorf("set node %s up: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("set node %s up: %w", id, ErrNotFound)
	}
	return nil
}

// SetNodeSchedule sets the operator's schedule of node id: "",
// NodeCordoned or NodeDraining.
func (q *Queries) SetNodeSchedule(ctx context.Context, id, schedule string) error {
	switch schedule {
	case "", NodeCordoned, NodeDraining:
	default:
		return fmt.Errorf("set node %s schedule: %w: %q", id, ErrInvalid, schedule)
	}
	n, err := q.execCount(ctx, "UPDATE nodes SET schedule = ? WHERE id = ?", schedule, id)
	if err != nil {
		return fmt.Errorf("set node %s schedule: %w", id, err)
	}
	if n == 0 {
		return fmt.Errorf("set node %s schedule: %w", id, ErrNotFound)
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

// NodeLoads counts the active (pending, running, stopping) sandboxes of
// each node that has any.
func (q *Queries) NodeLoads(ctx context.Context) (map[string]int, error) {
	in, args := inList(activeSandboxStatuses)
	rows, err := q.query(ctx, "SELECT node_id, COUNT(*) FROM sandboxes WHERE status IN ("+in+") GROUP BY node_id", args...)
	if err != nil {
		return nil, fmt.Errorf("count sandboxes per node: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, fmt.Errorf("count sandboxes per node: %w", err)
		}
		out[id] = n
	}
	return out, rows.Err()
}
