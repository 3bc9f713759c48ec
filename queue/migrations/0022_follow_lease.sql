-- A stream's lease that follows its partition (docs/design.md, "Hand-off"):
-- while follow_lease = lease_id, every message pushed to the partition
-- since the lease's lease_to was handed to that lease's stream, so the
-- lease covers up to the partition's last_offset; pushes here hand their
-- messages to it without writing the row, and its acks move lease_to up.
-- A push that does not hand to it clears it. A stale value (a lease that
-- ended) means nothing.
ALTER TABLE consumers ADD COLUMN follow_lease uuid;
