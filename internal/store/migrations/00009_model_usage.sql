-- What each account used of the operator's model providers through the
-- model proxy (package modelproxy), per UTC day: the requests forwarded
-- and the tokens the providers reported for them (input: prompt, cache
-- writes and cache reads; output: generated). The daily budgets are
-- checked against these rows, so every node of a cluster shares one count.
-- day is the UTC midnight that starts the day, in unix milliseconds.

-- +goose Up
CREATE TABLE model_usage (
    account_id    TEXT    NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    day           BIGINT  NOT NULL,
    requests      BIGINT  NOT NULL DEFAULT 0 CHECK (requests >= 0),
    input_tokens  BIGINT  NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens BIGINT  NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    updated_at    BIGINT  NOT NULL,
    PRIMARY KEY (account_id, day)
);

-- +goose Down
DROP TABLE model_usage;
