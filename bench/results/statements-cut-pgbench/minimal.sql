BEGIN;
SELECT count(*) FROM (SELECT 1 FROM partitions WHERE id = ANY(:pid::uuid[]) ORDER BY id FOR NO KEY UPDATE) x;
WITH b AS (UPDATE partitions p SET last_offset = p.last_offset + 1, last_push_at = now(), follow_xid = greatest(p.follow_xid, pg_current_xact_id()) WHERE p.id = ANY(:pid::uuid[]) RETURNING p.id, p.last_offset, p.queue_id, p.follow_xid) INSERT INTO messages (partition_id, seq, id, transaction_id, trace_id, producer_sub, payload, queue_id, follow_xid) SELECT b.id, b.last_offset, gen_random_uuid(), gen_random_uuid()::text, NULL, NULL, '{"t":1}'::jsonb, b.queue_id, b.follow_xid FROM b RETURNING partition_id, seq, created_at;
COMMIT;
