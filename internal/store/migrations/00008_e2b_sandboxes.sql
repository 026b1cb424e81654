-- What the E2B-compatible API (package e2b) keeps about a sandbox it
-- created, beside the sandbox's own row: the template the caller named, the
-- caller's metadata and environment variables (JSON objects of strings),
-- and the envd access token
-- the SDK sends to reach the sandbox's agent. The token is kept as it is,
-- not hashed: E2B's connect answers it again, and it grants nothing but
-- that one sandbox's agent while the sandbox lives (the row goes with the
-- sandbox's).

-- A sandbox's on_timeout says what its deadline does: '' stops it (as
-- always), 'pause' pauses it with its memory (E2B's autoPause), to be
-- resumed later.

-- +goose Up
ALTER TABLE sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT '';

CREATE TABLE e2b_sandboxes (
    sandbox_id   TEXT    PRIMARY KEY REFERENCES sandboxes (id) ON DELETE CASCADE,
    account_id   TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    template_id  TEXT    NOT NULL,
    metadata     TEXT    NOT NULL DEFAULT '{}',
    env_vars     TEXT    NOT NULL DEFAULT '{}',
    access_token TEXT    NOT NULL,
    -- '' when the sandbox's ports are public through the E2B domain, or
    -- the token a request to them must carry.
    traffic_token TEXT   NOT NULL DEFAULT '',
    created_at   BIGINT  NOT NULL
);
CREATE INDEX e2b_sandboxes_account_idx ON e2b_sandboxes (account_id, created_at);

-- +goose Down
DROP TABLE e2b_sandboxes;
ALTER TABLE sandboxes DROP COLUMN on_timeout;
