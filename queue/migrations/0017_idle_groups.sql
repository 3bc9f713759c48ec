-- Consumer groups that come and go (browser tabs each in a group of its
-- own) must cost a push nothing once they stop reading.
--
-- A push marks ready (copies its partition's last_offset to) only the
-- consumer rows that are caught up (last_offset <= cursor): a row already
-- ready stays in consumers_ready whatever its copy says, since its copy is
-- a lower bound of the partition's last_offset. Whoever leaves a row caught
-- up marks it again after its commit (see queue/doc.go, "Consumer rows").
-- This index is the caught-up rows of a partition: what a push writes.
CREATE INDEX consumers_caught_up ON consumers (partition_id, consumer_group) WHERE last_offset <= cursor;

-- When a consumer of the group last read (registration, a subscription
-- waiting, a pop), written at most every few minutes, not per message.
-- Retention removes a group idle longer than its queue's
-- idle_group_retention_seconds (0: never).
ALTER TABLE consumer_groups ADD COLUMN last_seen_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE queues ADD COLUMN idle_group_retention_seconds int NOT NULL DEFAULT 86400;
