-- A push no longer writes its partitions' consumer rows inside its own
-- transaction: it held them locked until its commit (fsync included), and
-- pops skip locked rows, so a partition pushed to without a pause looked
-- empty to every pop. The push commits its messages and partition offsets
-- first; right after, in a short transaction of its own (synchronous_commit
-- off: a lost one is repaired, see queue/doc.go "Consumer rows"), it copies
-- last_offset to the consumer rows that lag behind.
--
-- lock_partitions takes the push's partition locks in id order and fails
-- the transaction when one is gone (its queue was deleted since the id was
-- cached), so nothing of the push commits and the caller retries with fresh
-- ids. NO KEY UPDATE: dead-letter inserts' key-share locks pass.
CREATE FUNCTION lock_partitions(p_ids uuid[]) RETURNS bigint
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
	n bigint;
BEGIN
	SELECT count(*) INTO n FROM (SELECT 1 FROM partitions WHERE id = ANY(p_ids) ORDER BY id FOR NO KEY UPDATE) x;
	IF n <> cardinality(p_ids) THEN
		RAISE EXCEPTION 'herald: a partition of the push is gone' USING ERRCODE = 'P0002';
	END IF;
	RETURN n;
END
$$;
