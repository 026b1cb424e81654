-- Volumes (issue 35): an account's named persistent disks, mounted into
-- sandboxes at create. A volume's data is an ext4 image on the node that
-- last held it (data_node) and, in a cluster, a compressed copy in the blob
-- store (blob_key, the copy of generation). guest_written says a microVM
-- has had it read-write: its image was written by a guest kernel, so no
-- host kernel mounts it (a gVisor sandbox may not attach it).
--
-- An attachment is a sandbox's use of a volume: the lease. One read-write
-- attachment, or any number of read-only ones, never both; it goes when
-- the sandbox ended and its node released the volume (its data synced).

-- +goose Up
CREATE TABLE volumes (
    id            TEXT    PRIMARY KEY,
    account_id    TEXT    NOT NULL,
    name          TEXT    NOT NULL,
    size_bytes    BIGINT  NOT NULL,
    guest_written BOOLEAN NOT NULL DEFAULT FALSE,
    data_node     TEXT    NOT NULL DEFAULT '',
    blob_key      TEXT    NOT NULL DEFAULT '',
    generation    BIGINT  NOT NULL DEFAULT 0,
    forked_from   TEXT    NOT NULL DEFAULT '',
    created_at    BIGINT  NOT NULL,
    updated_at    BIGINT  NOT NULL,
    UNIQUE (account_id, name)
);
CREATE TABLE volume_attachments (
    sandbox_id TEXT    NOT NULL,
    volume_id  TEXT    NOT NULL,
    position   INTEGER NOT NULL,
    path       TEXT    NOT NULL,
    read_only  BOOLEAN NOT NULL,
    created_at BIGINT  NOT NULL,
    PRIMARY KEY (sandbox_id, volume_id)
);
CREATE INDEX volume_attachments_volume_idx ON volume_attachments (volume_id);

-- +goose Down
DROP TABLE volume_attachments;
DROP TABLE volumes;
