-- SQL producers enqueue with push(queue, partition, payload, transaction_id):
-- the same semantics as the HTTP push (queue and partition created on first
-- use, offset assigned under the partition row lock, duplicate transaction
-- ids stored once), and it wakes Herald instances with a NOTIFY on the
-- schema's channel. In the default deployment the schema is "herald", so it
-- is called as herald.push(...). search_path is pinned, so callers need not
-- set theirs.

-- uuid_v7 makes time-ordered ids like the server's (PostgreSQL 15 has no
-- uuidv7()): the first 48 bits are the Unix time in milliseconds.
CREATE FUNCTION uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
	SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
		placing substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
		FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

CREATE FUNCTION push(p_queue text, p_partition text, p_payload jsonb, p_transaction_id text DEFAULT NULL)
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
	SELECT q.id INTO v_queue FROM queues q WHERE q.name = p_queue;
	INSERT INTO partitions (id, queue_id, name) VALUES (uuid_v7(), v_queue, v_partition)
	ON CONFLICT (queue_id, name) DO NOTHING;
	-- The partition row lock orders pushes; the duplicate check after it
	-- (a new snapshot) sees every committed message.
	SELECT p.id INTO v_part FROM partitions p WHERE p.queue_id = v_queue AND p.name = v_partition FOR UPDATE;
	SELECT m.id INTO v_id FROM messages m WHERE m.partition_id = v_part AND m.transaction_id = v_txid;
	IF FOUND THEN
		RETURN QUERY SELECT v_id, 'duplicate'::text, v_part;
		RETURN;
	END IF;
	UPDATE partitions SET last_offset = last_offset + 1, last_push_at = now() WHERE id = v_part
	RETURNING last_offset INTO v_seq;
	v_id := uuid_v7();
	INSERT INTO messages (partition_id, seq, id, transaction_id, payload)
	VALUES (v_part, v_seq, v_id, v_txid, coalesce(p_payload, '{}'::jsonb));
	PERFORM pg_notify('herald.' || current_schema(), p_queue || E'\n' || v_partition);
	RETURN QUERY SELECT v_id, 'queued'::text, v_part;
END
$$;
