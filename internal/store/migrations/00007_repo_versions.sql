-- The accounts' repositories as a cluster shares them: each node keeps
-- copies, and the newest state of each repository is published here after
-- every change, as a bundle of its refs in the blob store. version counts
-- the changes; present is false once the repository was deleted; bundle is
-- the blob key of the bundle ('' for a repository without commits).

-- +goose Up
CREATE TABLE repo_versions (
    account_id TEXT    PRIMARY KEY,
    version    BIGINT  NOT NULL,
    present    BOOLEAN NOT NULL,
    bundle     TEXT    NOT NULL DEFAULT '',
    node_id    TEXT    NOT NULL DEFAULT '',
    updated_at BIGINT  NOT NULL
);
CREATE INDEX repo_versions_bundle ON repo_versions (bundle);

-- +goose Down
DROP TABLE repo_versions;
