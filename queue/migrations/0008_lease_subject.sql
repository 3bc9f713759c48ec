-- The subject (the token's sub) of the consumer the group's messages on
-- the partition were last leased to. Acks, lease extensions, transactions'
-- required leases and SSE resumes by a non-admin bearer are refused when it
-- is another subject's: a lease id learned out of band acts on nothing.
-- It outlives the lease (a late ack, after expiry, is checked against the
-- last delivery) and is NULL when that delivery had no subject (auth off, a
-- token without sub), which binds nothing.
ALTER TABLE consumers ADD COLUMN lease_subject text;
