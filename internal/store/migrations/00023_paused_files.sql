-- A pause of the files alone (issue 35): the sandbox's processes and
-- memory end, its files are saved as an untagged snapshot in the blob
-- store (its template_id from then on), and a resume starts it again from
-- them, on any node. paused_files says the pause is of that kind.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN paused_files BOOLEAN NOT NULL DEFAULT FALSE;

-- +goose Down
ALTER TABLE sandboxes DROP COLUMN paused_files;
