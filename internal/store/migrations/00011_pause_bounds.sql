-- How long a sandbox may stay paused is bounded (serve --max-paused): its
-- deadline clock stops while it is paused, and its saved memory holds the
-- node's disk until it resumes or stops. paused_at is when its current pause
-- began (NULL while it is not in a pause); the node hosting it stops it once
-- it has been paused longer than the bound. A sandbox already in a pause is
-- counted from its row's last update, the nearest the schema knew.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN paused_at BIGINT;
UPDATE sandboxes SET paused_at = updated_at WHERE pause <> '';

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN paused_at;
