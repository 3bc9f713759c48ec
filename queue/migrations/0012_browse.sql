-- Browsing and deleting single messages.
--
-- Offsets are dense, and a consumer row's cursor moves only over a
-- contiguous prefix of finished offsets, so a message deleted from the
-- middle of a partition must count as finished for every consumer group:
-- DeleteMessage marks it done in every row the partition has, and records
-- the offset here so that a group registered later (or a row started again
-- below it) starts with it done too. Offsets below the partition's first
-- remaining message are not kept: a registration starts after them anyway.
CREATE TABLE message_holes (
    partition_id uuid NOT NULL REFERENCES partitions (id) ON DELETE CASCADE,
    seq          bigint NOT NULL,
    PRIMARY KEY (partition_id, seq)
);

-- A message's dead letters (one per group that gave up on it), by
-- partition and offset: the status of a listed message, a partition's
-- dead-letter count and the deletion of a message read it. Dead letters
-- are few next to messages; the index costs their inserts only.
CREATE INDEX dead_letters_message ON dead_letters (partition_id, seq);
