-- Registry credentials of a template's build (issue 33): the credentials
-- a build pulls its image with, sealed (AES-GCM under a key of the node
-- that builds it, package templates), for the build job to open, also
-- after a restart. The row goes when the build ends (ready or failed) or
-- the template is deleted: nothing of the credentials outlives the build.
-- A table of its own, so that no query of templates ever reads it.

-- +goose Up
CREATE TABLE template_credentials (
    template_id TEXT   NOT NULL PRIMARY KEY,
    sealed      TEXT   NOT NULL,
    created_at  BIGINT NOT NULL
);

-- +goose Down
DROP TABLE template_credentials;
