-- Nodes of a cluster: where other nodes reach a node (its cluster
-- listener), what it offers (capacity: a JSON object), what it runs, and
-- its state. status is 'up' while it heartbeats and 'down' once a node
-- declared it dead (down_at); schedule is the operator's: '' (takes new
-- sandboxes), 'cordoned' (takes none, keeps its own) or 'draining'
-- (takes none and its sandboxes are being stopped).

-- +goose Up
ALTER TABLE nodes ADD COLUMN address TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN status TEXT NOT NULL DEFAULT 'up';
ALTER TABLE nodes ADD COLUMN schedule TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN capacity TEXT NOT NULL DEFAULT '{}';
ALTER TABLE nodes ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN down_at BIGINT;

-- +goose Down
ALTER TABLE nodes DROP COLUMN down_at;
ALTER TABLE nodes DROP COLUMN version;
ALTER TABLE nodes DROP COLUMN capacity;
ALTER TABLE nodes DROP COLUMN schedule;
ALTER TABLE nodes DROP COLUMN status;
ALTER TABLE nodes DROP COLUMN address;
