-- Follow streams: one total order over a queue's messages that a
-- late commit cannot jump, so that a follower resumes exactly from its last
-- position on any instance.
--
-- Offsets order a partition; across partitions commit order, offset order
-- and id order all differ. A message's follow position is (follow_xid,
-- partition_id, seq). follow_xid is the pushing transaction's id
-- (pg_current_xact_id()), raised to the partition's previous follow_xid
-- when that is higher (greatest, under the partition row lock the push
-- holds): a push may take its xid (locking another partition first) before
-- it waits for a partition that a push with a younger xid then writes and
-- commits first, and a partition's positions must grow with its offsets. So follow_xid never decreases along
-- a partition, and is never below the id of the transaction that wrote it.
--
-- Readers take only rows whose follow_xid is below their snapshot's xmin
-- (pg_snapshot_xmin(pg_current_snapshot()), the oldest transaction still
-- running): such a row's own transaction has ended, so it is visible now,
-- and every transaction still running or to come has an id at or above
-- that xmin, so no row will ever appear below it. What a reader has read is
-- a prefix of the order that never changes. xid8 is 64 bits: it does not
-- wrap around.
ALTER TABLE partitions ADD COLUMN follow_xid xid8 NOT NULL DEFAULT '0';
ALTER TABLE messages ADD COLUMN queue_id uuid, ADD COLUMN follow_xid xid8;
-- Messages from before this version: committed long ago, positions below
-- every new one, in partition order.
UPDATE messages m SET queue_id = p.queue_id, follow_xid = '1' FROM partitions p WHERE p.id = m.partition_id;
ALTER TABLE messages ALTER COLUMN queue_id SET NOT NULL, ALTER COLUMN follow_xid SET NOT NULL;

-- A queue's messages in follow order: a follower's read (after a position,
-- below the barrier) is one range of it.
CREATE INDEX messages_follow ON messages (queue_id, follow_xid, partition_id, seq);

-- The highest follow position retention deleted, per queue (scope = the
-- queue's id) and per partition (scope = the partition's id): a follower
-- whose position is below it lost messages, and is told so (event: gap).
-- Written by retention's delete statement, in its transaction; single
-- message deletes (an operator's) are not gaps. No foreign key: a deleted
-- queue's or partition's row is never read again.
CREATE TABLE follow_gone (
    scope        uuid PRIMARY KEY,
    follow_xid   xid8 NOT NULL,
    partition_id uuid NOT NULL,
    seq          bigint NOT NULL
);

-- The SQL producers' push writes the follow columns too.
CREATE OR REPLACE FUNCTION push(p_queue text, p_partition text, p_payload jsonb, p_transaction_id text DEFAULT NULL)
RETURNS TABLE (message_id uuid, status text, partition_id uuid)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	v_queue uuid;
	v_part uuid;
	v_seq bigint;
	v_fx xid8;
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
	SELECT p.id, p.queue_id INTO v_part, v_queue FROM partitions p JOIN queues q ON q.id = p.queue_id
	WHERE q.name = p_queue AND p.name = v_partition FOR NO KEY UPDATE OF p;
	SELECT m.id INTO v_id FROM messages m WHERE m.partition_id = v_part AND m.transaction_id = v_txid;
	IF FOUND THEN
		RETURN QUERY SELECT v_id, 'duplicate'::text, v_part;
		RETURN;
	END IF;
	UPDATE partitions SET last_offset = last_offset + 1, last_push_at = now(),
		follow_xid = greatest(partitions.follow_xid, pg_current_xact_id())
	WHERE id = v_part
	RETURNING last_offset, partitions.follow_xid INTO v_seq, v_fx;
	-- In key order, as acks and the server's pushes lock them.
	PERFORM 1 FROM consumers c WHERE c.partition_id = v_part ORDER BY c.consumer_group FOR NO KEY UPDATE;
	UPDATE consumers SET last_offset = v_seq WHERE consumers.partition_id = v_part;
	v_id := uuid_v7();
	INSERT INTO messages (partition_id, seq, id, transaction_id, payload, queue_id, follow_xid)
	VALUES (v_part, v_seq, v_id, v_txid, coalesce(p_payload, '{}'::jsonb), v_queue, v_fx);
	PERFORM pg_notify('herald.' || current_schema(), p_queue || E'\n' || v_partition);
	RETURN QUERY SELECT v_id, 'queued'::text, v_part;
END
$$;
