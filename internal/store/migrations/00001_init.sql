-- The first schema of sandboxd. One file serves SQLite and PostgreSQL, so it
-- uses only what both accept:
--   * Times are BIGINT unix milliseconds (UTC). SQLite has no timestamp type
--     and its drivers disagree on how to encode one; an integer compares,
--     sorts and round-trips identically on both, and fixes the precision at
--     the millisecond the API reports.
--   * Identifiers and enumerations are TEXT (with CHECK constraints for the
--     enumerations); JSON documents are TEXT, decoded by the application.
--   * Booleans are BOOLEAN: PostgreSQL stores a real boolean, SQLite stores
--     0/1, and both drivers scan either into a Go bool.
-- Foreign keys cascade where the child cannot outlive its parent; a snapshot
-- that is still some environment's or some snapshot's parent cannot be
-- deleted (NO ACTION), which makes garbage collection safe against races.

-- +goose Up
CREATE TABLE accounts (
    id                   TEXT    PRIMARY KEY,
    name                 TEXT    NOT NULL,
    slug                 TEXT    NOT NULL UNIQUE,
    kind                 TEXT    NOT NULL CHECK (kind IN ('personal', 'org')),
    members_share_access BOOLEAN NOT NULL DEFAULT FALSE,
    created_at           BIGINT  NOT NULL
);

CREATE TABLE org_members (
    org_id     TEXT   NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    account_id TEXT   NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (org_id, account_id)
);
CREATE INDEX org_members_account_idx ON org_members (account_id);

CREATE TABLE nodes (
    id           TEXT   PRIMARY KEY,
    hostname     TEXT   NOT NULL,
    started_at   BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL
);

CREATE TABLE snapshots (
    id         TEXT    PRIMARY KEY,
    account_id TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    parent_id  TEXT    REFERENCES snapshots (id),
    base_image TEXT    NOT NULL,
    blob_key   TEXT    NOT NULL,
    size       BIGINT  NOT NULL,
    depth      INTEGER NOT NULL,
    -- The sandbox it was captured from: history only, so no foreign key (the
    -- snapshot outlives the sandbox).
    sandbox_id TEXT,
    created_at BIGINT  NOT NULL
);
CREATE INDEX snapshots_account_idx ON snapshots (account_id, created_at);
CREATE INDEX snapshots_parent_idx ON snapshots (parent_id);

CREATE TABLE sandboxes (
    id             TEXT   PRIMARY KEY,
    account_id     TEXT   NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    -- Nodes come and go; a sandbox row keeps naming the node that hosted it.
    node_id        TEXT   NOT NULL,
    status         TEXT   NOT NULL CHECK (status IN ('pending', 'running', 'stopping', 'stopped', 'failed')),
    runtime        TEXT   NOT NULL,
    failure_reason TEXT   NOT NULL DEFAULT '',
    snapshot_id    TEXT   REFERENCES snapshots (id) ON DELETE SET NULL,
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL,
    deadline       BIGINT NOT NULL,
    stopped_at     BIGINT
);
CREATE INDEX sandboxes_account_idx ON sandboxes (account_id, created_at);
CREATE INDEX sandboxes_node_status_idx ON sandboxes (node_id, status);
CREATE INDEX sandboxes_status_deadline_idx ON sandboxes (status, deadline);
CREATE INDEX sandboxes_snapshot_idx ON sandboxes (snapshot_id);

CREATE TABLE api_keys (
    id           TEXT   PRIMARY KEY,
    account_id   TEXT   NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    name         TEXT   NOT NULL,
    prefix       TEXT   NOT NULL,
    hash         TEXT   NOT NULL UNIQUE,
    -- A key minted for one sandbox dies with it.
    sandbox_id   TEXT   REFERENCES sandboxes (id) ON DELETE CASCADE,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT,
    revoked_at   BIGINT,
    last_used_at BIGINT
);
CREATE INDEX api_keys_account_idx ON api_keys (account_id, created_at);
CREATE INDEX api_keys_sandbox_idx ON api_keys (sandbox_id);

CREATE TABLE runs (
    id          TEXT   PRIMARY KEY,
    account_id  TEXT   NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    -- Runs are history and outlive the sandbox they ran in: no foreign key.
    sandbox_id  TEXT,
    task        TEXT   NOT NULL,
    status      TEXT   NOT NULL CHECK (status IN ('QUEUED', 'EXECUTING', 'COMPLETED', 'FAILED', 'CRASHED', 'CANCELED', 'TIMED_OUT')),
    payload     TEXT   NOT NULL,
    output      TEXT,
    error       TEXT,
    tags        TEXT   NOT NULL DEFAULT '[]',
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    started_at  BIGINT,
    finished_at BIGINT
);
CREATE INDEX runs_account_idx ON runs (account_id, created_at);
CREATE INDEX runs_status_idx ON runs (status, created_at);
CREATE INDEX runs_sandbox_idx ON runs (sandbox_id);

CREATE TABLE environments (
    account_id  TEXT   PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    snapshot_id TEXT   REFERENCES snapshots (id),
    github_repo TEXT,
    expires_at  BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX environments_snapshot_idx ON environments (snapshot_id);

-- +goose Down
DROP TABLE environments;
DROP TABLE runs;
DROP TABLE api_keys;
DROP TABLE sandboxes;
DROP TABLE snapshots;
DROP TABLE nodes;
DROP TABLE org_members;
DROP TABLE accounts;
