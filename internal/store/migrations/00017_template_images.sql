-- Templates in a cluster (issue 33): the root filesystem of each image a
-- template was built from, as one blob in the blob store (a sandboxd layer
-- of the whole directory), by the image manifest's digest, so that a node
-- whose cache lacks a digest materialises it from there. A row is written
-- once its blob is stored; it goes when no template names its digest.

-- +goose Up
CREATE TABLE template_images (
    digest     TEXT   PRIMARY KEY,
    blob_key   TEXT   NOT NULL,
    size       BIGINT NOT NULL,
    bytes      BIGINT NOT NULL,
    entries    BIGINT NOT NULL,
    created_at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE template_images;
