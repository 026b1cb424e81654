-- Lifecycle events and webhooks (issue 35). An event is one change of a
-- sandbox (created, running, paused, resumed, updated, stopped, failed, a
-- named snapshot taken, a run finished), recorded in the transaction that
-- made the change. A webhook is an account's URL that events are POSTed
-- to, signed with its secret (sealed: the store never holds it in the
-- clear); events lists the types it takes as ",type,type," ('' for all),
-- format is 'sandboxd' or 'e2b' (E2B's payload and signature). A delivery
-- is one event for one webhook, inserted with the event (an outbox):
-- pending until a node's dispatcher hands it to a River job (queued), then
-- delivered, failed (its attempts spent) or cancelled (the webhook went).

-- +goose Up
CREATE TABLE events (
    id         TEXT   PRIMARY KEY,
    account_id TEXT   NOT NULL,
    sandbox_id TEXT   NOT NULL DEFAULT '',
    type       TEXT   NOT NULL,
    data       TEXT   NOT NULL DEFAULT '',
    created_at BIGINT NOT NULL
);
CREATE INDEX events_account_idx ON events (account_id, created_at, id);
CREATE INDEX events_sandbox_idx ON events (sandbox_id, created_at, id);
CREATE TABLE webhooks (
    id         TEXT    PRIMARY KEY,
    account_id TEXT    NOT NULL,
    name       TEXT    NOT NULL DEFAULT '',
    url        TEXT    NOT NULL,
    secret     TEXT    NOT NULL,
    events     TEXT    NOT NULL DEFAULT '',
    format     TEXT    NOT NULL DEFAULT 'sandboxd' CHECK (format IN ('sandboxd', 'e2b')),
    enabled    BOOLEAN NOT NULL DEFAULT TRUE,
    created_at BIGINT  NOT NULL,
    updated_at BIGINT  NOT NULL
);
CREATE INDEX webhooks_account_idx ON webhooks (account_id);
CREATE TABLE webhook_deliveries (
    id              TEXT    PRIMARY KEY,
    webhook_id      TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    account_id      TEXT    NOT NULL,
    status          TEXT    NOT NULL CHECK (status IN ('pending', 'queued', 'delivered', 'failed', 'cancelled')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    response_status INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT    NOT NULL DEFAULT '',
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);
CREATE INDEX webhook_deliveries_status_idx ON webhook_deliveries (status, created_at);
CREATE INDEX webhook_deliveries_webhook_idx ON webhook_deliveries (webhook_id, created_at);

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE webhooks;
DROP TABLE events;
