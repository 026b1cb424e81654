-- Named snapshots (issue 35): a sandbox's files saved under a name of its
-- account are a template whose kind is 'snapshot' ('' for a template). A
-- snapshot starts sandboxes as a template does; the lists of templates
-- leave snapshots out, and the lists of snapshots templates.

-- +goose Up
ALTER TABLE templates ADD COLUMN kind TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE templates DROP COLUMN kind;
