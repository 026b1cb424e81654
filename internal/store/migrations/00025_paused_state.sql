-- A pause with the memory whose saved state is also in the blob store
-- (issue 35, a cluster's nodes): paused_state is its blob's key, so that
-- another node resumes the sandbox, memory and all, once its node is gone.
-- '' for a pause kept on its node alone.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN paused_state TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN paused_state;
