-- A sandbox can be forked: started from another running sandbox's memory
-- and filesystem. forked_from names that sandbox ('' for a sandbox that
-- started from its account's snapshot or from nothing). No foreign key: a
-- child outlives its parent's row being deleted with the account only
-- together with it, and the id stays a record of where it came from.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN forked_from TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN forked_from;
