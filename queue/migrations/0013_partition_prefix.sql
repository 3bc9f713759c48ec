-- Searching a queue's partitions by the start of their name.
--
-- The console's partition search by substring (strpos over lower(name))
-- reads every index entry of the queue and every partition row: 22,682
-- blocks and 22-33 ms for a page, 26 ms more for its count, at 100,000
-- partitions. A prefix is a range of this index instead: the page and the
-- count read the matching entries only. The "C" collation orders by
-- bytes, which a range of prefixes needs whatever the database's
-- collation (the unique index on (queue_id, name) follows that one).
CREATE INDEX partitions_name_prefix ON partitions (queue_id, name COLLATE "C");
