-- The bytes an account's uploads in flight may spool, over every node of a
-- cluster: each upload holds one row while it spools and commits, grown as
-- its files arrive and deleted when it ends. expires_at (unix ms) lets the
-- rows of a node that died lapse: a live upload renews its row long before.

-- +goose Up
CREATE TABLE upload_reservations (
    id         TEXT   PRIMARY KEY,
    account_id TEXT   NOT NULL,
    bytes      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX upload_reservations_account ON upload_reservations (account_id, expires_at);

-- +goose Down
DROP TABLE upload_reservations;
