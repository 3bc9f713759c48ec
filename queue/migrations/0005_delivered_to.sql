-- The highest offset ever leased to a consumer group on a partition. An ack
-- that names no lease may only finish a message at or below it: a message
-- that was never delivered cannot be acknowledged away.
ALTER TABLE consumers ADD COLUMN delivered_to bigint NOT NULL DEFAULT 0;
-- Rows from before this column: what they delivered is unknown, so count
-- everything pushed so far as delivered (no legitimate late ack is refused
-- after an upgrade).
UPDATE consumers c SET delivered_to = p.last_offset FROM partitions p WHERE p.id = c.partition_id;
