-- Pops and pre-flights must not scan partitions. Every consumer row now
-- carries its queue and its partition's last_offset, which each push writes
-- under the partition row lock, so "the partitions with work for a group"
-- is a range of one partial index (consumers_ready), whatever the number of
-- partitions. The rows exist for every (partition, registered group) pair:
-- a new partition gets one per group of its queue, a new group one per
-- partition (see queue/doc.go, "Consumer rows").
--
-- Upgrade with every instance on this version: an older instance's push
-- does not write last_offset, so its messages stay unseen until the next
-- push to the same partition.
ALTER TABLE consumers ADD COLUMN queue_id uuid, ADD COLUMN last_offset bigint NOT NULL DEFAULT 0;
UPDATE consumers c SET queue_id = p.queue_id, last_offset = p.last_offset FROM partitions p WHERE p.id = c.partition_id;
INSERT INTO consumers (partition_id, consumer_group, queue_id, last_offset, cursor)
SELECT p.id, g.name, p.queue_id, p.last_offset, CASE WHEN g.subscribed_from IS NULL THEN 0 ELSE coalesce((
	SELECT m.seq FROM messages m WHERE m.partition_id = p.id AND m.created_at < g.subscribed_from
	ORDER BY m.seq DESC LIMIT 1), 0) END
FROM partitions p JOIN consumer_groups g ON g.queue_id = p.queue_id
ON CONFLICT DO NOTHING;
ALTER TABLE consumers ALTER COLUMN queue_id SET NOT NULL;

-- In the order pops take them: no lease first (least recently leased
-- first), then expired leases, then live ones by expiry, so the first rows
-- of a range are the eligible ones and the next the soonest to free.
CREATE INDEX consumers_ready ON consumers
    (queue_id, consumer_group, lease_expires_at NULLS FIRST, leased_at NULLS FIRST, partition_id)
    WHERE last_offset > cursor;

-- A push locks its partitions, then their consumer rows (which it writes):
-- both in key order, the second in key order as acks lock them, so a push
-- and an ack never wait for each other crosswise. One call, two statements
-- (only a locking clause at the top of a statement sorts before it locks).
-- It returns how many partitions it locked.
CREATE FUNCTION lock_for_push(p_ids uuid[]) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	n bigint;
BEGIN
	SELECT count(*) INTO n FROM (SELECT 1 FROM partitions WHERE id = ANY(p_ids) ORDER BY id FOR NO KEY UPDATE) x;
	PERFORM 1 FROM consumers WHERE partition_id = ANY(p_ids) ORDER BY partition_id, consumer_group FOR NO KEY UPDATE;
	RETURN n;
END
$$;

-- The SQL producers' push keeps the same rows: a new partition's consumer
-- rows under the queue's share lock (group registration takes the queue's
-- no-key-update lock, so one of the two sees the other), last_offset under
-- the partition's lock. The partition lock is FOR NO KEY UPDATE, which does
-- not block the key-share locks of dead-letter inserts.
CREATE OR REPLACE FUNCTION push(p_queue text, p_partition text, p_payload jsonb, p_transaction_id text DEFAULT NULL)
RETURNS TABLE (message_id uuid, status text, partition_id uuid)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	v_queue uuid;
	v_part uuid;
	v_seq bigint;
	v_id uuid;
	v_txid text := coalesce(nullif(p_transaction_id, ''), uuid_v7()::text);
	v_partition text := coalesce(nullif(p_partition, ''), 'Default');
BEGIN
	IF p_queue IS NULL OR p_queue = '' THEN
		RAISE EXCEPTION 'queue must not be empty' USING ERRCODE = '22023';
	END IF;
	INSERT INTO queues (id, name, namespace, task)
	VALUES (uuid_v7(), p_queue,
	        CASE WHEN position('.' IN p_queue) > 1 THEN split_part(p_queue, '.', 1) ELSE '' END,
	        CASE WHEN position('.' IN p_queue) > 1 THEN split_part(p_queue, '.', 2) ELSE '' END)
	ON CONFLICT (name) DO NOTHING;
	SELECT p.id INTO v_part FROM partitions p JOIN queues q ON q.id = p.queue_id
	WHERE q.name = p_queue AND p.name = v_partition;
	IF NOT FOUND THEN
		SELECT q.id INTO v_queue FROM queues q WHERE q.name = p_queue FOR SHARE;
		INSERT INTO partitions (id, queue_id, name) VALUES (uuid_v7(), v_queue, v_partition)
		ON CONFLICT (queue_id, name) DO NOTHING;
		INSERT INTO consumers (partition_id, consumer_group, queue_id)
		SELECT p.id, g.name, p.queue_id FROM partitions p JOIN consumer_groups g ON g.queue_id = p.queue_id
		WHERE p.queue_id = v_queue AND p.name = v_partition
		ON CONFLICT DO NOTHING;
	END IF;
	-- The partition row lock orders pushes; the duplicate check after it
	-- (a new snapshot) sees every committed message.
	SELECT p.id INTO v_part FROM partitions p JOIN queues q ON q.id = p.queue_id
	WHERE q.name = p_queue AND p.name = v_partition FOR NO KEY UPDATE OF p;
	SELECT m.id INTO v_id FROM messages m WHERE m.partition_id = v_part AND m.transaction_id = v_txid;
	IF FOUND THEN
		RETURN QUERY SELECT v_id, 'duplicate'::text, v_part;
		RETURN;
	END IF;
	UPDATE partitions SET last_offset = last_offset + 1, last_push_at = now() WHERE id = v_part
	RETURNING last_offset INTO v_seq;
	-- In key order, as acks and the server's pushes lock them.
	PERFORM 1 FROM consumers c WHERE c.partition_id = v_part ORDER BY c.consumer_group FOR NO KEY UPDATE;
	UPDATE consumers SET last_offset = v_seq WHERE consumers.partition_id = v_part;
	v_id := uuid_v7();
	INSERT INTO messages (partition_id, seq, id, transaction_id, payload)
	VALUES (v_part, v_seq, v_id, v_txid, coalesce(p_payload, '{}'::jsonb));
	PERFORM pg_notify('herald.' || current_schema(), p_queue || E'\n' || v_partition);
	RETURN QUERY SELECT v_id, 'queued'::text, v_part;
END
$$;
