-- The push SQL function (for SQL producers) marks ready only the consumer
-- rows that are caught up, as the server's push does (migration 0017,
-- queue/doc.go "Consumer rows"): groups that read a queue and left cost it
-- nothing once the first push after they left has marked their rows, so
-- its cost and its WAL do not grow with them. Everything else is as in
-- 0015.
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
	-- Only the caught-up rows (consumers_caught_up), locked in key order as
	-- acks and the server's pushes lock them: a row already ready stays
	-- ready (its copy is a lower bound), and whoever leaves one caught up
	-- marks it after its commit, waiting for this partition lock first.
	WITH lk AS (
		SELECT c.partition_id, c.consumer_group FROM consumers c
		WHERE c.partition_id = v_part AND c.last_offset <= c.cursor AND c.last_offset < v_seq
		ORDER BY c.consumer_group
		FOR NO KEY UPDATE
	)
	UPDATE consumers c SET last_offset = v_seq FROM lk
	WHERE c.partition_id = lk.partition_id AND c.consumer_group = lk.consumer_group AND c.last_offset < v_seq;
	v_id := uuid_v7();
	INSERT INTO messages (partition_id, seq, id, transaction_id, payload, queue_id, follow_xid)
	VALUES (v_part, v_seq, v_id, v_txid, coalesce(p_payload, '{}'::jsonb), v_queue, v_fx);
	PERFORM pg_notify('herald.' || current_schema(), p_queue || E'\n' || v_partition);
	RETURN QUERY SELECT v_id, 'queued'::text, v_part;
END
$$;
