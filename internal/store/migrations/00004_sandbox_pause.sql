-- A running sandbox can be paused: its memory, processes and filesystem
-- saved on its node, nothing of it running. pause is '' (not paused),
-- 'pausing', 'paused' or 'resuming'; status stays 'running' meanwhile (the
-- sandbox keeps its place, its key and its disk). paused_remaining_ms is the
-- lifetime it had left when the pause began: its deadline clock stops while
-- it is paused and starts again from there when it resumes.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN pause TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN paused_remaining_ms BIGINT;

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN paused_remaining_ms;
ALTER TABLE sandboxes DROP COLUMN pause;
