-- Templates in a cluster (issue 33): the root filesystem of each image a
-- template was built from, as one blob in the blob store (a sandboxd layer
-- of the whole directory), by the image manifest's digest, so that a node
-- whose cache lacks a digest materialises it from there. A row is written
-- once its blob is stored; it goes when no template names its digest.
-- template_layers.used_at is when a build last took the cache entry (0:
-- never since it was made, at created_at): entries no template names and
-- unused for long are collected.

-- +goose Up
CREATE TABLE template_images (
    digest     TEXT   PRIMARY KEY,
    blob_key   TEXT   NOT NULL,
    size       BIGINT NOT NULL,
    bytes      BIGINT NOT NULL,
    entries    BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);
ALTER TABLE template_layers ADD COLUMN used_at BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE template_layers DROP COLUMN used_at;
DROP TABLE template_images;
