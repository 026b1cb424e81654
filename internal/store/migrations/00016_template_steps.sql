-- Templates built with steps (issue 33): definition is the build's
-- definition as JSON (the steps, or the Dockerfile's text) for a template
-- built with steps, '' for one from an image alone; layers is the chain of
-- layer blobs (JSON array of blob keys, bottom first) a sandbox from it
-- restores over the base image, '' for none. template_layers is the
-- build cache: the layer each step made, by the step's cache key
-- (templatespec.CacheKeys), per account.

-- +goose Up
ALTER TABLE templates ADD COLUMN definition TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN layers TEXT NOT NULL DEFAULT '';
CREATE TABLE template_layers (
    account_id TEXT   NOT NULL,
    cache_key  TEXT   NOT NULL,
    blob_key   TEXT   NOT NULL,
    size       BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (account_id, cache_key)
);
CREATE INDEX template_layers_blob_idx ON template_layers (blob_key);

-- +goose Down
DROP INDEX template_layers_blob_idx;
DROP TABLE template_layers;
ALTER TABLE templates DROP COLUMN layers;
ALTER TABLE templates DROP COLUMN definition;
