-- E2B's Template API (issue 33): a template's row is one name and tag; a
-- build that has several tags has a row per tag, each a copy of the
-- build's row. build_id names the row of the build a copy was made from
-- ('' for a build's own row). A row whose tag starts with '~' has no tag:
-- a build waiting to take its tags, or a build whose tag moved to a newer
-- one and whose sandboxes still run (collected when none do).

-- +goose Up
ALTER TABLE templates ADD COLUMN build_id TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE templates DROP COLUMN build_id;
