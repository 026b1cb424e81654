-- A failed sandbox's failure_reason is shown to its user now (the API's
-- failureReason, E2B's not-found answer for it): a phrase for the user,
-- never a host path or an internal error. Reasons were written that way
-- already but for one: a sandbox of a node declared down named that
-- node's id ("its node <uuid> stopped answering (no heartbeat for 31s)"),
-- which means nothing to its user. Those rows get the wording sandboxd
-- writes now, without the id or the silence's length (the log has both).
-- (failure_reason also holds why a stopped sandbox stopped, "timeout" for
-- one; the API shows it only for failed sandboxes.)

-- +goose Up
UPDATE sandboxes SET failure_reason = 'its node stopped answering; its processes and unsaved work are lost'
    WHERE status = 'failed' AND failure_reason LIKE 'its node % stopped answering%';

-- +goose Down
-- Nothing to undo in the schema; the node ids are not restored.
SELECT 1;
