-- A sandbox that one of the service's own tasks started for an account
-- (the account's setup, a coding agent) names that task; '' for the
-- sandboxes the account asked for. The account's lists leave out its
-- setup's sandbox: the user never asked for it (the setup's run still
-- names it, as sandboxId).

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN task TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN task;
