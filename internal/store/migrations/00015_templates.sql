-- Templates (issue 33): a root filesystem built from a source (an OCI
-- image, for now) that sandboxes start from. account_id is '' for the
-- operator's public templates. digest is the image manifest's digest the
-- source was pinned to, which keys the node's cache of unpacked images;
-- config is the image's Env, WorkingDir, User, Entrypoint and Cmd as JSON.
-- build_log keeps the build's last lines (bounded by the store); node_id is
-- the node whose cache the build fills (its restart resumes the build).
-- A sandbox names the template it started from ('' for the built-in image).

-- +goose Up
CREATE TABLE templates (
    id             TEXT   PRIMARY KEY,
    account_id     TEXT   NOT NULL DEFAULT '',
    name           TEXT   NOT NULL,
    tag            TEXT   NOT NULL,
    status         TEXT   NOT NULL CHECK (status IN ('building', 'ready', 'failed')),
    source         TEXT   NOT NULL,
    digest         TEXT   NOT NULL DEFAULT '',
    config         TEXT   NOT NULL DEFAULT '',
    failure_reason TEXT   NOT NULL DEFAULT '',
    build_log      TEXT   NOT NULL DEFAULT '',
    node_id        TEXT   NOT NULL DEFAULT '',
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    UNIQUE (account_id, name, tag)
);
CREATE INDEX templates_digest_idx ON templates (digest);
ALTER TABLE sandboxes ADD COLUMN template_id TEXT NOT NULL DEFAULT '';
CREATE INDEX sandboxes_template_idx ON sandboxes (template_id);

-- +goose Down
DROP INDEX sandboxes_template_idx;
ALTER TABLE sandboxes DROP COLUMN template_id;
DROP INDEX templates_digest_idx;
DROP TABLE templates;
