-- Retention records its holes.
--
-- Completed retention takes messages from the middle of a partition (every
-- group finished them out of order). It now records those offsets in
-- message_holes, as DeleteMessage does, so that a group registered, sought
-- or reset later counts them as finished by reading the holes, not by
-- scanning every stored offset of the partition for gaps. This records the
-- gaps the runs before it left: every offset with no message above the
-- partition's first remaining message (between remaining messages, and
-- after the last one up to last_offset). One ordered pass over messages'
-- primary key, once.
INSERT INTO message_holes (partition_id, seq)
SELECT w.partition_id, g
FROM (
    SELECT m.partition_id, m.seq, lead(m.seq) OVER (PARTITION BY m.partition_id ORDER BY m.seq) AS next
    FROM messages m
) w
JOIN partitions p ON p.id = w.partition_id
CROSS JOIN LATERAL generate_series(w.seq + 1, coalesce(w.next, p.last_offset + 1) - 1) AS g
ON CONFLICT DO NOTHING;
