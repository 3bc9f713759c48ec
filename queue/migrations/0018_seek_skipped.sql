-- What the last seek (or group reset) of a consumer row passed over: the
-- offsets in (seek_from, seek_to] count as done because a position moved,
-- not because anyone acked them. An ack naming a lease from before it (the
-- seek ended that lease) may not pass for a harmless repeat there
-- (ack_decide.go). Empty (both 0) until a seek moves the row forward; a
-- move back trims it to the new position.
ALTER TABLE consumers
	ADD COLUMN seek_from bigint NOT NULL DEFAULT 0,
	ADD COLUMN seek_to   bigint NOT NULL DEFAULT 0;
