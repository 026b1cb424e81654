-- A run cut by its sandbox's deadline used to end TIMED_OUT, a status that is
-- not in the published TaskRunResponse enum the original's web clients know
-- (they poll it forever). Such runs are FAILED now, with an error message that
-- says the sandbox reached its timeout; rewrite the old rows the same way.

-- +goose Up
UPDATE runs SET status = 'FAILED',
    error = COALESCE(error, '{"message":"the sandbox reached its timeout"}')
    WHERE status = 'TIMED_OUT';

-- +goose Down
SELECT 1;
