-- E2B's autoResume (issue 35): a sandbox created with it resumes when
-- traffic reaches it (its ports, its envd) while it is paused.

-- +goose Up
ALTER TABLE e2b_sandboxes ADD COLUMN auto_resume BOOLEAN NOT NULL DEFAULT FALSE;

-- +goose Down
ALTER TABLE e2b_sandboxes DROP COLUMN auto_resume;
