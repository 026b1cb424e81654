-- Ended work is kept for a while and then deleted (package retention):
-- sandboxes that stopped or failed, by stopped_at, and finished runs, by
-- finished_at. Both columns are set by the one transition that ends a row
-- (TransitionSandbox, FinishRun); a row that ended without one (written
-- by hand, or by a version older than those) is given its last update, so
-- that the sweep's index finds every ended row. Rows that have not ended
-- hold NULL, which the indexes below leave out of their ranges.

-- +goose Up
UPDATE sandboxes SET stopped_at = updated_at
    WHERE status IN ('stopped', 'failed') AND stopped_at IS NULL;
UPDATE runs SET finished_at = updated_at
    WHERE status IN ('COMPLETED', 'FAILED', 'CRASHED', 'CANCELED') AND finished_at IS NULL;
CREATE INDEX sandboxes_stopped_at_idx ON sandboxes (stopped_at);
CREATE INDEX runs_finished_at_idx ON runs (finished_at);

-- +goose Down
DROP INDEX runs_finished_at_idx;
DROP INDEX sandboxes_stopped_at_idx;
