-- The network policy a sandbox was created with, as the API's JSON
-- ("none", "egress" or {"allow": [...]}); '' means none. It is stored so the
-- node that starts the sandbox (possibly from a job) applies the same policy.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN network;
