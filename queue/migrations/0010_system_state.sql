-- Cluster-wide switches every instance obeys: the reference
-- server's two maintenance modes, maintenance_mode (pushes go to each
-- instance's disk buffer, not here) and pop_maintenance_mode (pops answer
-- 204, subscriptions get nothing). One row per key; value is
-- {"enabled": bool}; a missing row is off. Instances re-read the table
-- every few seconds and on the NOTIFY its writer sends (queue.SetSystemFlag),
-- so this row, not any cache, is the truth.
CREATE TABLE system_state (
    key        text PRIMARY KEY,
    value      jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text NOT NULL DEFAULT ''
);
